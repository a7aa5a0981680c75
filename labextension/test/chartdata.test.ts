import assert from 'node:assert/strict';
import { test } from 'node:test';

import type { IReading, IRunRecord } from '../src/api';
import { formatTraffic, machineCharts, runCharts, smooth, withBreaks } from '../src/chartdata';

const step = (t: number, step: number, loss: number | null, lr = 0.1): IRunRecord => ({
  t,
  kind: 'step',
  step,
  epoch: 0,
  loss,
  lr
});

test('the smoothed loss is a debiased moving average that skips missing values', () => {
  // 0.5: (0.5 * 2) / 0.5 = 2; then (0.5 * 1 + 0.5 * 4) / 0.75 = 10/3
  assert.deepEqual(smooth([2, null, 4], 0.5), [2, null, 10 / 3]);
});

test('on the step axis a resumed run replaces the steps it did again', () => {
  const records = [
    { t: 1, kind: 'start', step: 0 },
    step(2, 10, 1.0),
    step(3, 20, 0.9),
    step(4, 30, 0.8),
    { t: 5, kind: 'start', step: 20 },
    step(6, 30, 0.7),
    step(7, 40, 0.6)
  ];
  const [loss] = runCharts(records, 'step');
  assert.deepEqual(loss.data[0], [10, 20, 30, 40]);
  assert.deepEqual(loss.data[1], [1.0, 0.9, 0.7, 0.6]);
  const [byTime] = runCharts(records, 'time');
  assert.deepEqual(byTime.data[0], [2, 3, 4, 6, 7]);
});

test('the epochs chart has each metric of the epochs, by name', () => {
  const epoch = (t: number, steps: number, figures: number[]): IRunRecord => {
    const [val_loss, train_loss, val_accuracy] = figures;
    return { t, kind: 'epoch', epoch: t, steps, val_loss, train_loss, val_accuracy, seconds: 3 };
  };
  const records = [step(1, 5, 1.0), epoch(2, 5, [0.8, 0.9, 0.5]), epoch(4, 10, [0.7, 0.6, 0.6])];
  const charts = runCharts(records, 'step');
  assert.deepEqual(charts.map(chart => chart.spec.name), ['loss', 'lr', 'epochs']);
  const epochs = charts[2];
  const labels = epochs.spec.series.map(series => series.label);
  assert.deepEqual(labels, ['train_loss', 'val_accuracy', 'val_loss']);
  assert.deepEqual(epochs.data, [[5, 10], [0.9, 0.6], [0.5, 0.6], [0.8, 0.7]]);
});

test("the machine's charts have a series per GPU, missing where a GPU was not read", () => {
  const reading = (time: number, gpus: [number, number][]): IReading =>
    ({
      time,
      gpus: gpus.map(([index, utilization]) => ({
        index,
        utilization_percent: utilization,
        memory_used: 1,
        memory_total: 40
      })),
      cpu: { percent: 50 },
      ram: { used: 2, limit: 8 },
      disks: [{ name: 'home', used: 3, total: 10 }],
      network: { received_per_s: time * 100, sent_per_s: null }
    }) as unknown as IReading;
  const charts = machineCharts([reading(1, [[0, 10]]), reading(2, [[0, 20], [1, 30]])]);
  assert.deepEqual(charts.map(chart => chart.spec.name), [
    'gpu-utilization',
    'gpu-memory',
    'cpu',
    'ram',
    'disks',
    'network',
    'disk-io'
  ]);
  assert.deepEqual(charts[0].data, [[1, 2], [10, 20], [null, 30]]);
  assert.deepEqual(charts[1].spec.range, [0, 40]);
  assert.deepEqual(charts[3].data, [[1, 2], [2, 2], [8, 8]]);
  assert.deepEqual(charts[4].spec.range, [0, 10]);
  assert.deepEqual(charts[5].data, [[1, 2], [100, 200], [null, null]]);
});

test("the machine's disk I/O chart has bytes read and written per second", () => {
  const reading = (time: number, disk_io?: IReading['disk_io']): IReading =>
    ({
      time,
      gpus: [],
      cpu: { percent: 0 },
      ram: { used: 1, limit: 2 },
      disks: [],
      disk_io
    }) as unknown as IReading;
  const charts = machineCharts([
    reading(1), // an older server's: no disk I/O at all
    reading(2, { read_per_s: null, written_per_s: null }),
    reading(3, { read_per_s: 4096, written_per_s: 2.5 * 1024 ** 2 })
  ]);
  const diskIo = charts.find(chart => chart.spec.name === 'disk-io');
  assert.ok(diskIo, 'a disk I/O chart');
  assert.equal(diskIo.spec.title, 'Disk I/O');
  assert.deepEqual(diskIo.spec.series.map(series => series.label), ['read', 'written']);
  assert.deepEqual(diskIo.data, [
    [1, 2, 3],
    [null, null, 4096],
    [null, null, 2.5 * 1024 ** 2]
  ]);
  assert.equal(diskIo.spec.format(2.5 * 1024 ** 2), '2.5 MiB/s');
});

test('network traffic is in bytes, KiB or MiB per second', () => {
  assert.equal(formatTraffic(512), '512 B/s');
  assert.equal(formatTraffic(3.5 * 1024), '3.5 KiB/s');
  assert.equal(formatTraffic(12 * 1024 ** 2), '12.0 MiB/s');
});

test('a line breaks where the readings stop for more than three minutes', () => {
  assert.deepEqual(withBreaks([[0, 60, 300, 301], [1, 2, 3, 4]]), [
    [0, 60, 61, 300, 301],
    [1, 2, null, 3, 4]
  ]);
  const steady: [number[], number[]] = [[0, 60, 120], [1, 2, 3]];
  assert.deepEqual(withBreaks(steady), steady);
});
