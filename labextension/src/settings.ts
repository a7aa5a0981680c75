/**
 * The user's settings (schema/plugin.json), read into one typed, range-checked object.
 */
import { ISettingRegistry } from '@jupyterlab/settingregistry';

/** What the status bar item may show. */
export type StatusBarPart = 'gpu-utilization' | 'gpu-memory' | 'ram' | 'cpu';

const STATUS_BAR_PARTS: readonly StatusBarPart[] = [
  'gpu-utilization',
  'gpu-memory',
  'ram',
  'cpu'
];

export interface IOptions {
  /** Seconds between two requests for new figures. */
  refreshInterval: number;
  statusBar: StatusBarPart[];
  /** Percent of the RAM limit at which RAM is shown as critical and notified. */
  ramWarningPercent: number;
  /** Percent of a GPU's memory at which it is shown as critical and notified. */
  gpuMemoryWarningPercent: number;
  notifications: boolean;
}

/** The settings without a settings registry (the schema's defaults). */
export const DEFAULT_OPTIONS: Readonly<IOptions> = {
  refreshInterval: 2,
  statusBar: ['gpu-utilization', 'gpu-memory', 'ram'],
  ramWarningPercent: 90,
  gpuMemoryWarningPercent: 90,
  notifications: true
};

/**
 * The composite settings, each kept inside the schema's range: the settings editor
 * refuses values outside it, a hand-edited file may still hold them.
 */
export function readOptions(settings: ISettingRegistry.ISettings): IOptions {
  const value = (key: keyof IOptions): unknown => settings.get(key).composite;
  const parts = value('statusBar');
  return {
    refreshInterval: clamp(value('refreshInterval'), 1, 60, DEFAULT_OPTIONS.refreshInterval),
    statusBar: Array.isArray(parts)
      ? STATUS_BAR_PARTS.filter(part => parts.includes(part))
      : [...DEFAULT_OPTIONS.statusBar],
    ramWarningPercent: clamp(
      value('ramWarningPercent'),
      10,
      100,
      DEFAULT_OPTIONS.ramWarningPercent
    ),
    gpuMemoryWarningPercent: clamp(
      value('gpuMemoryWarningPercent'),
      10,
      100,
      DEFAULT_OPTIONS.gpuMemoryWarningPercent
    ),
    notifications:
      typeof value('notifications') === 'boolean'
        ? (value('notifications') as boolean)
        : DEFAULT_OPTIONS.notifications
  };
}

function clamp(value: unknown, low: number, high: number, fallback: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    return fallback;
  }
  return Math.min(high, Math.max(low, value));
}
