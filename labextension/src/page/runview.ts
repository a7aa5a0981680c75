/**
 * The run on the page: what runs where, its progress (step of total, epoch), the time it
 * still needs against the session's time left, and its curves, drawn with uPlot: the loss
 * (each logged step, smoothed, and the validation loss at each epoch's end), the learning
 * rate, and the other validation figures by epoch.
 */
import uPlot from 'uplot';
import { element, setAttribute, setText } from '../dom';
import { formatDuration } from '../format';
import { SMOOTHING, smooth } from '../chartdata';
import { runHost } from '../runformat';
import type { IEpochRow, RunFollower } from './runs';

const CHART_HEIGHT = 160;
const COLORS = ['#1976d2', '#e65100', '#388e3c', '#8e24aa', '#00838f', '#6d4c41'];

export class RunSection {
  readonly node = element('section', { class: 'ipycloud-Card ipycloud-Run', hidden: '' });

  constructor() {
    this.node.append(
      element('div', { class: 'ipycloud-Card-title' }, this._title),
      this._progress,
      this._figures,
      this._eta,
      this._charts
    );
  }

  /** Draw what the follower holds now, with the session's time left as the kernel reads it. */
  render(runs: RunFollower, sessionLeft: number | null): void {
    const run = runs.run;
    if (!run) {
      this.node.hidden = true;
      return;
    }
    this.node.hidden = false;
    setAttribute(this.node, 'data-ipycloud-run', run.id);
    setAttribute(this.node, 'data-ipycloud-run-status', run.status);
    setAttribute(this.node, 'data-ipycloud-run-step', String(run.step));
    const what = [run.model, run.device, run.notebook, runHost(run)].filter(Boolean).join(' · ');
    setText(this._title, `Run ${run.id}${what ? ` · ${what}` : ''} · ${run.status}`);

    const total = run.total_steps;
    this._progress.max = total ?? 1;
    this._progress.value = total ? Math.min(run.step, total) : 0;
    const percent = total ? ` (${Math.floor((100 * run.step) / total)}%)` : '';
    const epochs = run.epochs ? `/${run.epochs}` : '';
    const loss = run.last_loss === null ? '' : ` · loss ${run.last_loss.toPrecision(4)}`;
    const best = run.best ? ` · best ${run.best.metric} ${run.best.value.toPrecision(4)}` : '';
    const speed = run.steps_per_s ? ` · ${run.steps_per_s.toFixed(2)} steps/s` : '';
    setText(
      this._figures,
      `step ${run.step}${total ? `/${total}` : ''}${percent} · epoch ${run.epoch}${epochs}` +
        `${speed}${loss}${best}`
    );
    this._renderEta(run.status === 'running' ? run.eta_s : null, sessionLeft ?? run.session_left_s);
    this._renderCharts(runs);
  }

  private _renderEta(eta: number | null, sessionLeft: number | null): void {
    const parts = [eta === null ? '' : `ETA ${formatDuration(eta)}`];
    if (sessionLeft !== null) {
      parts.push(`session left ${formatDuration(sessionLeft)}`);
    }
    const short = eta !== null && sessionLeft !== null && eta > sessionLeft;
    if (short) {
      parts.push(`the session ends ${formatDuration(eta - sessionLeft)} before the run`);
    }
    setText(this._eta, parts.filter(Boolean).join(' · '));
    setAttribute(this._eta, 'data-ipycloud-level', short ? 'over' : 'ok');
  }

  private _renderCharts(runs: RunFollower): void {
    const steps = runs.steps;
    const x = steps.map(row => row.step);
    const loss = steps.map(row => row.loss);
    const validationLoss = atSteps(x, runs.epochs, 'val_loss');
    this._chart('loss', 'step', x, [
      ['loss', loss, COLORS[0], 1],
      ['smoothed', smooth(loss, SMOOTHING), COLORS[1], 2],
      ...(validationLoss.some(value => value !== null)
        ? ([['val_loss', validationLoss, COLORS[2], 0]] as Series[])
        : [])
    ]);
    this._chart('lr', 'step', x, [['lr', steps.map(row => row.lr), COLORS[3], 2]]);
    const names = [...new Set(runs.epochs.flatMap(row => Object.keys(row.metrics)))].filter(
      name => name !== 'val_loss'
    );
    if (names.length) {
      this._chart(
        'validation',
        'epoch',
        runs.epochs.map(row => row.epoch),
        names.map((name, index) => [
          name,
          runs.epochs.map(row => row.metrics[name] ?? null),
          COLORS[(index + 2) % COLORS.length],
          2
        ])
      );
    }
  }

  /** Draw (or redraw) one chart; a series of width 0 is drawn as points only. */
  private _chart(name: string, axis: string, x: number[], series: Series[]): void {
    const data = [x, ...series.map(([, values]) => values)] as uPlot.AlignedData;
    const labels = series.map(([label]) => label).join();
    let chart = this._plots.get(name);
    if (chart && chart.labels !== labels) {
      chart.plot.destroy(); // a new series (the first validation): drawn anew, in its place
    }
    if (!chart || chart.labels !== labels) {
      const holder =
        chart?.holder ??
        this._charts.appendChild(
          element('div', { class: 'ipycloud-Run-chart', 'data-ipycloud-chart': name })
        );
      const plot = new uPlot(
        {
          width: Math.max(200, (this._charts.clientWidth || 600) / 3 - 12),
          height: CHART_HEIGHT,
          scales: { x: { time: false, range: padded } },
          axes: [{ label: axis }, {}],
          series: [
            { label: axis },
            ...series.map(([label, , stroke, width]) => ({
              label,
              stroke,
              width: width || 1,
              spanGaps: width === 0,
              paths: width === 0 ? () => null : undefined,
              points: { show: width === 0 || x.length < 30 }
            }))
          ]
        },
        data,
        holder
      );
      chart = { plot, holder, labels };
      this._plots.set(name, chart);
    } else {
      chart.plot.setData(data);
    }
    setAttribute(chart.holder, 'data-ipycloud-points', String(x.length));
  }

  private _title = element('span');
  private _progress = element('progress', { class: 'ipycloud-Run-progress' });
  private _figures = element('div', { class: 'ipycloud-Run-figures' });
  private _eta = element('div', { class: 'ipycloud-Run-eta' });
  private _charts = element('div', { class: 'ipycloud-Run-charts' });
  private _plots = new Map<string, { plot: uPlot; holder: HTMLElement; labels: string }>();
}

/** The x axis's range: the data's, or one either side of a single value. */
function padded(_plot: uPlot, min: number, max: number): uPlot.Range.MinMax {
  return min === max ? [min - 1, max + 1] : [min, max];
}

/** A chart's series: its label, values, colour and line width (0: points only). */
type Series = [string, (number | null)[], string, number];

/** The epochs' `metric` at the steps they ended on, null at the other steps. */
function atSteps(x: readonly number[], epochs: readonly IEpochRow[], metric: string): (number | null)[] {
  const byStep = new Map(epochs.map(row => [row.step, row.metrics[metric] ?? null]));
  return x.map(step => byStep.get(step) ?? null);
}
