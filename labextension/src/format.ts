/**
 * Figures in words: sizes, percentages, durations, and how close a share is to its limit.
 */

const GIB = 1024 ** 3;

/** `12.7 GiB`, `512 MiB`, `n/a` for a missing figure. */
export function formatBytes(bytes: number | null): string {
  if (bytes === null || !Number.isFinite(bytes)) {
    return 'n/a';
  }
  if (bytes >= GIB) {
    return `${(bytes / GIB).toFixed(1)} GiB`;
  }
  return `${Math.round(bytes / 1024 ** 2)} MiB`;
}

/** `5.2/12.7 GiB`: a used size against its total, in the total's unit. */
export function formatUsage(used: number, total: number): string {
  if (total >= GIB) {
    return `${(used / GIB).toFixed(1)}/${(total / GIB).toFixed(1)} GiB`;
  }
  return `${Math.round(used / 1024 ** 2)}/${Math.round(total / 1024 ** 2)} MiB`;
}

/** `37%`, `n/a` for a missing figure. */
export function formatPercent(percent: number | null): string {
  return percent === null ? 'n/a' : `${Math.round(percent)}%`;
}

/** `1 h 05 min`, `12 min`, `40 s`. */
export function formatDuration(seconds: number): string {
  const total = Math.max(0, Math.round(seconds));
  if (total < 60) {
    return `${total} s`;
  }
  const minutes = Math.floor(total / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, '0')} min`;
}

/** The share of `total` that `used` is, in percent; `null` when there is no total. */
export function share(used: number, total: number): number | null {
  return total > 0 ? (100 * used) / total : null;
}

/** How a share stands against its warning threshold. */
export type Level = 'ok' | 'near' | 'over';

/** Points below the threshold from which a share is shown as near it. */
export const NEAR_MARGIN = 10;

export function level(percent: number | null, threshold: number): Level {
  if (percent === null) {
    return 'ok';
  }
  if (percent >= threshold) {
    return 'over';
  }
  return percent >= threshold - NEAR_MARGIN ? 'near' : 'ok';
}
