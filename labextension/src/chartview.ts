/**
 * The full-size chart view of a run or of the machine: a main-area widget whose charts
 * follow the server's figures, polled while the view is shown, drawn with uPlot.
 */
import { Message } from '@lumino/messaging';
import { IPoll, Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { ApiError } from './api';
import { Chart, XAxis } from './chart';
import type { IChartContent } from './chartdata';
import type { IChartSource } from './chartsources';
import { element, setAttribute, setText } from './dom';

/** The smallest height of one chart, in pixels: more charts than fit make the view scroll. */
const MIN_CHART_HEIGHT = 160;

/** What a chart adds around its plot: its title and its legend, in pixels. */
const CHART_CHROME = 64;

/** Views made so far: each view's charts share a cursor of their own. */
let viewCount = 0;

export class ChartView extends Widget {
  /**
   * @param source - where the figures come from
   * @param interval - seconds between two requests
   */
  constructor(
    readonly source: IChartSource,
    interval: number
  ) {
    super();
    this.addClass('ipycloud-ChartView');
    this._axis = source.axes[0];
    this._syncKey = `ipycloud-chart-${++viewCount}`;
    this._summary = element('div', { class: 'ipycloud-ChartView-summary' });
    this._note = element('div', { class: 'ipycloud-Card-note' }, 'Asking the server…');
    this._charts = element('div', { class: 'ipycloud-ChartView-charts' });
    this.node.append(
      element('div', { class: 'ipycloud-ChartView-head' }, this._summary, this._axisToggle()),
      this._note,
      this._charts
    );
    this._poll = new Poll({
      auto: false,
      factory: () => this._refresh(),
      frequency: frequency(interval),
      name: 'ipycloud:chart',
      standby: () => document.hidden || !this.isVisible
    });
  }

  get axis(): XAxis {
    return this._axis;
  }

  /** Draw the charts over another axis. */
  set axis(axis: XAxis) {
    if (axis === this._axis) {
      return;
    }
    this._axis = axis;
    for (const button of Array.from(this.node.querySelectorAll('[data-ipycloud-axis-choice]'))) {
      setAttribute(
        button,
        'aria-pressed',
        String(button.getAttribute('data-ipycloud-axis-choice') === axis)
      );
    }
    this._render();
  }

  /** Seconds between two requests. */
  set interval(seconds: number) {
    this._poll.frequency = frequency(seconds);
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    for (const chart of this._shown.values()) {
      chart.dispose();
    }
    super.dispose();
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    void this._poll.start();
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this._poll.refresh();
    this._fit();
  }

  protected override onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._fit();
  }

  private _axisToggle(): HTMLElement {
    const toggle = element('div', { class: 'ipycloud-ChartView-axes', role: 'group' });
    if (this.source.axes.length < 2) {
      return toggle;
    }
    for (const axis of this.source.axes) {
      const button = element(
        'button',
        {
          class: 'jp-Button jp-mod-styled',
          'data-ipycloud-axis-choice': axis,
          'aria-pressed': String(axis === this._axis)
        },
        axis === 'step' ? 'Steps' : 'Time'
      );
      button.addEventListener('click', () => (this.axis = axis));
      toggle.append(button);
    }
    return toggle;
  }

  private async _refresh(): Promise<void> {
    try {
      if (await this.source.refresh()) {
        this._render();
      }
      setText(this._note, this._shown.size ? '' : 'Nothing to draw yet.');
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        setText(this._note, `Nothing to show: ${error.message}.`);
        void this._poll.stop();
        return;
      }
      const message = error instanceof Error ? error.message : String(error);
      setText(this._note, `No new figures: ${message}. Trying again…`);
      throw error;
    }
  }

  private _render(): void {
    this.title.label = this.source.label;
    setText(this._summary, this.source.summary);
    const contents = this.source.charts(this._axis);
    const shown = new Map<string, Chart>();
    for (const content of contents) {
      shown.set(Chart.key(content.spec, this._axis), this._chartFor(content));
    }
    for (const [key, chart] of this._shown) {
      if (!shown.has(key)) {
        chart.dispose();
      }
    }
    const added = [...shown.keys()].some(key => !this._shown.has(key));
    this._shown = shown;
    this._charts.replaceChildren(...[...shown.values()].map(chart => chart.node));
    if (added) {
      this._fit();
    }
  }

  private _chartFor(content: IChartContent): Chart {
    const key = Chart.key(content.spec, this._axis);
    const chart = this._shown.get(key) ?? new Chart(content.spec, this._axis, this._syncKey);
    chart.setData(content.data);
    return chart;
  }

  /** Share the view's height between the charts; each takes the whole width. */
  private _fit(): void {
    if (!this.isVisible || !this._shown.size) {
      return;
    }
    const width = this._charts.clientWidth;
    const height = Math.max(
      MIN_CHART_HEIGHT,
      Math.floor(this._charts.clientHeight / this._shown.size) - CHART_CHROME
    );
    for (const chart of this._shown.values()) {
      chart.setSize(width, height);
    }
  }

  private _axis: XAxis;
  private readonly _syncKey: string;
  private _summary: HTMLElement;
  private _note: HTMLElement;
  private _charts: HTMLElement;
  private _poll: Poll;
  private _shown = new Map<string, Chart>();
}

function frequency(seconds: number): IPoll.Frequency {
  const interval = Math.round(seconds * 1000);
  return { interval, backoff: true, max: Math.max(interval, 60_000) };
}
