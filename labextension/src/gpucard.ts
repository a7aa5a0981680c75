/**
 * One GPU in the panel: name, utilisation, memory, temperature and power with sparklines,
 * and its MIG instances.
 */
import { IGpuReading, IReading } from './api';
import { element, setText } from './dom';
import { formatPercent, formatUsage, level, share } from './format';
import { MetricRow } from './metric';

/** The sparkline's top for temperatures, in °C. */
const TEMPERATURE_SCALE = 100;

export class GpuCard {
  readonly node: HTMLElement;

  /** @param index - the GPU's index as the server numbers it */
  constructor(readonly index: number) {
    this._title = element('div', { class: 'ipycloud-Card-title' });
    this._mig = element('div', { class: 'ipycloud-Card-note' });
    this.node = element(
      'section',
      { class: 'ipycloud-Card', 'data-ipycloud-gpu': String(index) },
      this._title,
      ...Object.values(this._rows).map(row => row.node),
      this._mig
    );
  }

  /**
   * @param samples - the history, oldest first; its last sample is drawn in words
   * @param threshold - the GPU memory warning threshold, in percent
   */
  update(samples: readonly IReading[], threshold: number): void {
    const history = samples.map(sample => findGpu(sample, this.index));
    const gpu = history[history.length - 1];
    if (!gpu) {
      return;
    }
    setText(this._title, `GPU ${gpu.index} · ${gpu.name}`);
    const rows = this._rows;
    rows.utilization.update(
      formatPercent(gpu.utilization_percent),
      history.map(g => g?.utilization_percent ?? null),
      100
    );
    const memoryShare = share(gpu.memory_used, gpu.memory_total);
    rows.memory.update(
      `${formatUsage(gpu.memory_used, gpu.memory_total)} (${formatPercent(memoryShare)})`,
      history.map(g => (g ? share(g.memory_used, g.memory_total) : null)),
      100,
      level(memoryShare, threshold)
    );
    rows.temperature.update(
      gpu.temperature_c === null ? 'n/a' : `${Math.round(gpu.temperature_c)} °C`,
      history.map(g => g?.temperature_c ?? null),
      TEMPERATURE_SCALE
    );
    const powerScale = gpu.power_limit_w ?? Math.max(1, ...history.map(g => g?.power_w ?? 0));
    rows.power.update(
      gpu.power_w === null
        ? 'n/a'
        : `${Math.round(gpu.power_w)}` +
            (gpu.power_limit_w === null ? ' W' : `/${Math.round(gpu.power_limit_w)} W`),
      history.map(g => g?.power_w ?? null),
      powerScale
    );
    setText(
      this._mig,
      gpu.mig.length
        ? 'MIG: ' +
            gpu.mig
              .map(
                (instance, i) => `#${i} ${formatUsage(instance.memory_used, instance.memory_total)}`
              )
              .join(', ')
        : ''
    );
  }

  private _title: HTMLElement;
  private _mig: HTMLElement;
  private _rows = {
    utilization: new MetricRow('Utilisation', 'utilization'),
    memory: new MetricRow('Memory', 'memory'),
    temperature: new MetricRow('Temperature', 'temperature'),
    power: new MetricRow('Power', 'power')
  };
}

/** The GPU of that index in a reading (at the same position, unless the list changed). */
function findGpu(reading: IReading, index: number): IGpuReading | null {
  const gpus = reading.gpus;
  const guess = gpus[index];
  if (guess?.index === index) {
    return guess;
  }
  return gpus.find(gpu => gpu.index === index) ?? null;
}
