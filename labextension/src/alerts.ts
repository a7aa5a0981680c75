/**
 * JupyterLab notifications: RAM or a GPU's memory crossing its threshold (once per
 * crossing, not at every reading), and a kernel's death with its reason.
 */
import { Notification } from '@jupyterlab/apputils';

import { IEvent, IReading } from './api';
import { formatOf, formatPercent, share } from './format';
import { IOptions } from './settings';

/** Points a share must fall below its threshold before a new crossing is notified. */
const REARM_MARGIN = 5;

export class Alerts {
  /** @param openPanel - the notification's action */
  constructor(private readonly _openPanel: () => void) {}

  /** Notify the thresholds that the latest reading crossed. */
  checkReading(reading: IReading, options: IOptions): void {
    if (!options.notifications) {
      return;
    }
    const { ram } = reading;
    this._check('ram', share(ram.used, ram.limit), options.ramWarningPercent, percent =>
      ram.limited
        ? `RAM at ${formatPercent(percent)} of the container's limit ` +
          `(${formatOf(ram.used, ram.limit)}): ` +
          'a kernel that needs more is killed'
        : `RAM at ${formatPercent(percent)} of the machine's ` +
          `(${formatOf(ram.used, ram.limit)})`
    );
    for (const gpu of reading.gpus) {
      this._check(
        `gpu:${gpu.uuid}`,
        share(gpu.memory_used, gpu.memory_total),
        options.gpuMemoryWarningPercent,
        percent =>
          `GPU ${gpu.index} memory at ${formatPercent(percent)} ` +
          `(${formatOf(gpu.memory_used, gpu.memory_total)})`
      );
    }
  }

  /** Notify kernel deaths, with the server's own words. */
  notifyEvents(events: readonly IEvent[], options: IOptions): void {
    if (!options.notifications) {
      return;
    }
    for (const event of events.filter(event => event.kind === 'kernel_died')) {
      Notification.error(event.message, {
        autoClose: false,
        actions: [{ label: 'Show resources', callback: this._openPanel }],
        data: { ipycloud: 'kernel_died', kernel_id: event.kernel_id }
      });
    }
  }

  private _check(
    key: string,
    percent: number | null,
    threshold: number,
    message: (percent: number) => string
  ): void {
    if (percent === null) {
      return;
    }
    if (percent >= threshold && !this._above.has(key)) {
      this._above.add(key);
      Notification.warning(message(percent), {
        autoClose: 10_000,
        actions: [{ label: 'Show resources', callback: this._openPanel }],
        data: { ipycloud: 'threshold', key }
      });
    } else if (percent < threshold - REARM_MARGIN) {
      this._above.delete(key);
    }
  }

  /** The figures above their thresholds, notified already. */
  private _above = new Set<string>();
}
