/**
 * The CPU and RAM rows of a reading, shared by the lab panel and the kernel's own page.
 */
import type { IReading } from './api';
import { element, setText } from './dom';
import {
  amountIn,
  formatBytes,
  formatCores,
  formatIn,
  formatPercent,
  formatUsage,
  level,
  share,
  unitFor
} from './format';
import { MetricRow } from './metric';

export class MachineRows {
  readonly cpu = new MetricRow('CPU', 'cpu');
  readonly ram = new MetricRow('RAM', 'ram');
  readonly ramNote = element('div', { class: 'ipycloud-Card-note' });
  /** The Jupyter server's memory and its kernels'; hidden where a reading has none. */
  readonly jupyter = new MetricRow('Jupyter', 'jupyter');

  /** The rows' nodes, in the order they are shown. */
  get nodes(): Node[] {
    return [this.cpu.node, this.ram.node, this.ramNote, this.jupyter.node];
  }

  /** Show the latest reading and the history of ``samples``; RAM warns from the threshold. */
  render(samples: readonly IReading[], latest: IReading, ramWarningPercent: number): void {
    const { cpu, ram } = latest;
    const cores = cpu.cores === null ? '' : ` of ${formatCores(cpu.cores)}`;
    const throttled =
      cpu.throttled_percent === null ? '' : `, throttled ${formatPercent(cpu.throttled_percent)}`;
    this.cpu.update(
      `${formatPercent(cpu.percent)}${cores}${throttled}`,
      samples.map(sample => sample.cpu.percent),
      100
    );
    const ramShare = share(ram.used, ram.limit);
    this.ram.update(
      `${formatUsage(ram.used, ram.limit)} (${formatPercent(ramShare)})`,
      samples.map(sample => share(sample.ram.used, sample.ram.limit)),
      100,
      level(ramShare, ramWarningPercent)
    );
    const notes = [
      ram.limited ? "limit: the container's" : "limit: the machine's RAM (no container limit)"
    ];
    if (ram.peak !== null) {
      notes.push(`peak ${formatBytes(ram.peak)}`);
    }
    if (ram.swap_total > 0) {
      notes.push(`swap ${formatUsage(ram.swap_used, ram.swap_total)}`);
    }
    setText(this.ramNote, notes.join(' · '));
    this._renderJupyter(samples, latest);
  }

  private _renderJupyter(samples: readonly IReading[], latest: IReading): void {
    const { server_rss, kernels_rss, limit } = latest.ram;
    this.jupyter.node.hidden = server_rss === null;
    if (server_rss === null) {
      return;
    }
    const unit = unitFor(limit);
    this.jupyter.update(
      `server ${amountIn(server_rss, unit)} · kernels ${formatIn(kernels_rss ?? 0, unit)}`,
      samples.map(({ ram }) =>
        ram.server_rss === null ? null : share(ram.server_rss + (ram.kernels_rss ?? 0), ram.limit)
      ),
      100
    );
  }
}
