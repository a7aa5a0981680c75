/**
 * One uPlot chart: its series drawn over a time or step axis, with values under the
 * cursor in the legend, drag to zoom and double-click to zoom out, coloured from
 * JupyterLab's theme variables.
 */
import uPlot from 'uplot';

import { element, setAttribute } from './dom';

const AXIS_FONT_PX = 11;

/** What the horizontal axis counts. */
export type XAxis = 'time' | 'step';

export interface ISeriesSpec {
  label: string;
  /** A JupyterLab CSS variable, e.g. `--jp-brand-color1`. */
  colour: string;
  width?: number;
  /** Mark each point: for series of a few points (one per epoch). */
  points?: boolean;
}

export interface IChartSpec {
  /** A stable name, as `data-ipycloud-chart`, e.g. `loss`. */
  name: string;
  title: string;
  series: ISeriesSpec[];
  /** A value in words, for the vertical axis and the legend. */
  format: (value: number) => string;
  /** The vertical scale's fixed range (e.g. 0-100 for a percentage); else it fits. */
  range?: [number, number];
}

/** One chart's data: the x values, then each series' values (`null` where missing). */
export type ChartData = [number[], ...(number | null)[][]];

export class Chart {
  readonly node: HTMLElement;

  /**
   * @param spec - what the chart shows
   * @param axis - what the x values are
   * @param syncKey - charts with the same key show the cursor at the same x
   */
  constructor(
    readonly spec: IChartSpec,
    readonly axis: XAxis,
    syncKey: string
  ) {
    this.node = element('div', {
      class: 'ipycloud-Chart',
      'data-ipycloud-chart': spec.name,
      'data-ipycloud-axis': axis
    });
    this._plot = new uPlot(
      options(spec, axis, syncKey, (plot, key) => this._scaleSet(plot, key)),
      [[]],
      this.node
    );
  }

  /** Who the chart is for: a chart of another key is drawn anew. */
  static key(spec: IChartSpec, axis: XAxis): string {
    return [spec.name, axis, ...spec.series.map(series => series.label)].join('\n');
  }

  /** Show `data`; a chart zoomed in by the user keeps its zoom, else it follows the end. */
  setData(data: ChartData): void {
    this._settingData = true;
    try {
      this._plot.setData(data as uPlot.AlignedData, !this._zoomed);
    } finally {
      this._settingData = false;
    }
    setAttribute(this.node, 'data-ipycloud-points', String(data[0].length));
  }

  setSize(width: number, height: number): void {
    if (width > 0 && height > 0) {
      this._plot.setSize({ width, height });
    }
  }

  dispose(): void {
    this._plot.destroy();
    this.node.remove();
  }

  /** The user zoomed (drag) or zoomed out (double-click) when the x scale was set by them. */
  private _scaleSet(plot: uPlot, key: string): void {
    if (key !== 'x' || this._settingData) {
      return;
    }
    const xs = plot.data[0];
    const { min, max } = plot.scales.x;
    this._zoomed =
      xs.length > 1 && min !== undefined && max !== undefined &&
      (min > xs[0] || max < xs[xs.length - 1]);
  }

  private _plot: uPlot;
  private _zoomed = false;
  private _settingData = false;
}

/** The vertical axis's width in pixels: its longest label, its ticks and a gap. */
function axisWidth(labels: readonly string[] | null): number {
  const longest = Math.max(4, ...(labels ?? []).map(label => label.length));
  return Math.ceil(longest * AXIS_FONT_PX * 0.62) + 16;
}

function options(
  spec: IChartSpec,
  axis: XAxis,
  syncKey: string,
  onScale: (plot: uPlot, key: string) => void
): uPlot.Options {
  const style = getComputedStyle(document.body);
  const colour = (name: string) => style.getPropertyValue(name).trim() || 'currentColor';
  // The canvas needs a size in pixels: the theme's sizes are in em.
  const family = style.getPropertyValue('--jp-ui-font-family').trim() || 'sans-serif';
  const font = `${AXIS_FONT_PX}px ${family}`;
  const text = colour('--jp-ui-font-color1');
  const grid = colour('--jp-border-color2');
  const format = (value: number | null) => (value === null ? '–' : spec.format(value));
  const axisStyle = {
    stroke: text,
    font,
    grid: { stroke: grid, width: 1 },
    ticks: { stroke: grid }
  };
  return {
    title: spec.title,
    width: 400,
    height: 200,
    scales: {
      x: { time: axis === 'time' },
      y: spec.range ? { range: spec.range } : {}
    },
    series: [
      axis === 'time'
        ? { label: 'time' }
        : { label: 'step', value: (_, value) => (value === null ? '–' : String(value)) },
      ...spec.series.map(series => ({
        label: series.label,
        stroke: colour(series.colour),
        width: series.width ?? 1.5,
        spanGaps: false,
        points: { show: series.points ?? false },
        value: (_: uPlot, value: number | null) => format(value)
      }))
    ],
    axes: [
      axisStyle,
      {
        ...axisStyle,
        values: (_, splits) => splits.map(value => format(value)),
        size: (_, values) => axisWidth(values)
      }
    ],
    cursor: { sync: { key: syncKey }, drag: { x: true, y: false, setScale: true } },
    legend: { live: true },
    hooks: { setScale: [onScale] }
  };
}
