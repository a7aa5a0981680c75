/**
 * What the chart view draws, from a run's record or the machine's readings: pure
 * functions from the server's JSON to uPlot's columns.
 */
import type { IReading, IRunRecord } from './api';
import type { ChartData, IChartSpec, XAxis } from './chart';
import { formatBytes, formatPercent } from './format';
import { formatFigure } from './runformat';

/** A chart's spec and the data it shows now. */
export interface IChartContent {
  spec: IChartSpec;
  data: ChartData;
}

/** The weight of the past in the smoothed loss (an exponential moving average). */
export const SMOOTHING = 0.9; // as the notebook's curves (TensorBoard's debiased average)

/** The room above a limit drawn as a line, so the line shows under the chart's frame. */
const HEADROOM = 1.05;

/** Seconds without a reading that break the machine's lines: the history keeps one a
 * minute beyond its last hour, so a longer silence is the server's. */
const BREAK_S = 180;

/** Series colours, as JupyterLab's theme variables, in the order series take them. */
const PALETTE = [
  '--jp-brand-color1',
  '--jp-warn-color1',
  '--jp-success-color1',
  '--jp-error-color1',
  '--jp-accent-color1',
  '--jp-brand-color3',
  '--jp-warn-color3',
  '--jp-success-color3'
];

/** The loss (raw and smoothed), the learning rate and the epochs' metrics of a run. */
export function runCharts(records: readonly IRunRecord[], axis: XAxis): IChartContent[] {
  const steps = alongAxis(records.filter(record => record.kind === 'step'), axis);
  const epochs = alongAxis(records.filter(record => record.kind === 'epoch'), axis);
  const xs = steps.map(row => row.x);
  const loss = steps.map(row => figure(row.record.loss));
  const charts: IChartContent[] = [
    {
      spec: {
        name: 'loss',
        title: 'Loss',
        series: [
          { label: 'loss', colour: '--jp-brand-color3', width: 1 },
          { label: 'smoothed', colour: '--jp-brand-color1', width: 2 }
        ],
        format: formatFigure
      },
      data: [xs, loss, smooth(loss, SMOOTHING)]
    },
    {
      spec: {
        name: 'lr',
        title: 'Learning rate',
        series: [{ label: 'lr', colour: '--jp-warn-color1' }],
        format: formatFigure
      },
      data: [xs, steps.map(row => figure(row.record.lr))]
    }
  ];
  const metrics = epochMetrics(epochs.map(row => row.record));
  if (metrics.length) {
    charts.push({
      spec: {
        name: 'epochs',
        title: 'Epochs',
        series: metrics.map((name, i) => ({
          label: name,
          colour: PALETTE[i % PALETTE.length],
          points: true
        })),
        format: formatFigure
      },
      data: [
        epochs.map(row => row.x),
        ...metrics.map(name => epochs.map(row => figure(row.record[name])))
      ]
    });
  }
  return charts;
}

/** GPU utilisation and memory, CPU, RAM, disk use, network traffic and disk I/O over time. */
export function machineCharts(samples: readonly IReading[]): IChartContent[] {
  const xs = samples.map(sample => sample.time);
  const latest = samples[samples.length - 1];
  const gpus = latest?.gpus ?? [];
  const perGpu = (value: (gpu: IReading['gpus'][number]) => number | null) =>
    gpus.map(({ index }) =>
      samples.map(sample => {
        const gpu = sample.gpus.find(entry => entry.index === index);
        return gpu ? value(gpu) : null;
      })
    );
  const gpuSeries = gpus.map(({ index }, i) => ({
    label: `GPU ${index}`,
    colour: PALETTE[i % PALETTE.length]
  }));
  const charts: IChartContent[] = [];
  if (gpus.length) {
    charts.push(
      {
        spec: {
          name: 'gpu-utilization',
          title: 'GPU utilisation',
          series: gpuSeries,
          format: formatPercent,
          range: [0, 100]
        },
        data: [xs, ...perGpu(gpu => gpu.utilization_percent)]
      },
      {
        spec: {
          name: 'gpu-memory',
          title: 'GPU memory',
          series: gpuSeries,
          format: formatBytes,
          range: [0, Math.max(...gpus.map(gpu => gpu.memory_total ?? 0))]
        },
        data: [xs, ...perGpu(gpu => gpu.memory_used)]
      }
    );
  }
  const disks = latest?.disks ?? [];
  charts.push(
    {
      spec: {
        name: 'cpu',
        title: 'CPU',
        series: [{ label: 'CPU', colour: PALETTE[0] }],
        format: formatPercent,
        range: [0, 100]
      },
      data: [xs, samples.map(sample => sample.cpu.percent)]
    },
    {
      spec: {
        name: 'ram',
        title: 'RAM',
        series: [
          { label: 'used', colour: PALETTE[0] },
          { label: 'limit', colour: '--jp-error-color1', width: 1 }
        ],
        format: formatBytes,
        range: [0, HEADROOM * Math.max(...samples.map(sample => sample.ram.limit))]
      },
      data: [xs, samples.map(sample => sample.ram.used), samples.map(sample => sample.ram.limit)]
    },
    {
      spec: {
        name: 'disks',
        title: 'Disk space used',
        series: disks.map((disk, i) => ({ label: disk.name, colour: PALETTE[i % PALETTE.length] })),
        format: formatBytes,
        range: [0, Math.max(...disks.map(disk => disk.total))]
      },
      data: [
        xs,
        ...disks.map(disk =>
          samples.map(sample => sample.disks.find(entry => entry.name === disk.name)?.used ?? null)
        )
      ]
    },
    ratesChart('network', 'Network', samples, {
      received: sample => sample.network?.received_per_s ?? null,
      sent: sample => sample.network?.sent_per_s ?? null
    }),
    ratesChart('disk-io', 'Disk I/O', samples, {
      read: sample => sample.disk_io?.read_per_s ?? null,
      written: sample => sample.disk_io?.written_per_s ?? null
    })
  );
  return charts.map(chart => ({ ...chart, data: withBreaks(chart.data) }));
}

/** A chart of bytes per second over time: a series per label, read from each reading. */
function ratesChart(
  name: string,
  title: string,
  samples: readonly IReading[],
  rates: Record<string, (sample: IReading) => number | null>
): IChartContent {
  const labels = Object.keys(rates);
  return {
    spec: {
      name,
      title,
      series: labels.map((label, i) => ({ label, colour: PALETTE[i % PALETTE.length] })),
      format: formatTraffic
    },
    data: [samples.map(sample => sample.time), ...labels.map(label => samples.map(rates[label]))]
  };
}

/**
 * `data` with a break (a point of no values) where its x values jump by more than
 * BREAK_S, so a line does not cross the time the server was down.
 */
export function withBreaks(data: ChartData): ChartData {
  const [xs, ...series] = data;
  const jumps = xs.flatMap((x, i) => (i > 0 && x - xs[i - 1] > BREAK_S ? [i] : []));
  if (!jumps.length) {
    return data;
  }
  const split = <T>(values: readonly T[], gap: (i: number) => T): T[] =>
    values.flatMap((value, i) => (jumps.includes(i) ? [gap(i), value] : [value]));
  return [split(xs, i => xs[i - 1] + 1), ...series.map(values => split(values, () => null))];
}

/** `512 B/s`, `3.4 KiB/s`, `12.0 MiB/s`: traffic spans more units than memory does. */
export function formatTraffic(bytesPerSecond: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let value = bytesPerSecond;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : Math.round(value)} ${units[unit]}/s`;
}

/**
 * A debiased exponential moving average: `weight` of the past in each point; a missing
 * value stays missing and leaves the average as it was.
 */
export function smooth(values: readonly (number | null)[], weight: number): (number | null)[] {
  let average = 0;
  let count = 0;
  return values.map(value => {
    if (value === null) {
      return null;
    }
    count += 1;
    average = weight * average + (1 - weight) * value;
    return average / (1 - weight ** count);
  });
}

/** Records with their x value, ascending: on the step axis a resumed run's steps replace
 * those it did again (a rerun from an older checkpoint). */
function alongAxis(
  records: readonly IRunRecord[],
  axis: XAxis
): { x: number; record: IRunRecord }[] {
  const rows: { x: number; record: IRunRecord }[] = [];
  for (const record of records) {
    const step = record.kind === 'epoch' ? record.steps : record.step;
    const x = axis === 'time' ? record.t : figure(step);
    if (x === null) {
      continue;
    }
    while (rows.length && rows[rows.length - 1].x >= x) {
      rows.pop();
    }
    rows.push({ x, record });
  }
  return rows;
}

/** The numeric metrics of the epochs by name: `train_loss`, then the `val_*` ones. */
function epochMetrics(epochs: readonly IRunRecord[]): string[] {
  const skip = new Set(['t', 'kind', 'epoch', 'steps', 'seconds']);
  const names = new Set<string>();
  for (const record of epochs) {
    for (const [name, value] of Object.entries(record)) {
      if (!skip.has(name) && typeof value === 'number') {
        names.add(name);
      }
    }
  }
  return [...names].sort();
}

function figure(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}
