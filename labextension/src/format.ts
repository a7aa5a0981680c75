/**
 * Figures in words: sizes, percentages, durations, and how close a share is to its limit.
 */

import type { IDiskReading } from './api';

const GIB = 1024 ** 3;
const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/**
 * A pair of sizes is shown in the largest unit of which its total holds this many, as
 * ipycloud/runtime/units.py does: MiB below 4 GiB, GiB from 4 GiB to 4 TiB.
 */
const PAIR_UNIT_MIN = 4;

/** A unit to write sizes in. */
export interface IUnit {
  name: string;
  bytes: number;
}

/** The unit in which sizes up to `total` are shown together. */
export function unitFor(total: number): IUnit {
  let power = 0;
  while (power < UNITS.length - 1 && Math.abs(total) >= PAIR_UNIT_MIN * 1024 ** (power + 1)) {
    power += 1;
  }
  return { name: UNITS[power], bytes: 1024 ** power };
}

/** `256`, `12.7`: the number of `unit`s, whole up to MiB, to one decimal from GiB. */
export function amountIn(bytes: number, unit: IUnit): string {
  return (bytes / unit.bytes).toFixed(unit.bytes >= GIB ? 1 : 0);
}

/** `256 MiB`, `12.7 GiB`: bytes in `unit`. */
export function formatIn(bytes: number, unit: IUnit): string {
  return `${amountIn(bytes, unit)} ${unit.name}`;
}

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

/** `5.2/12.7 GiB`, `256/1024 MiB`: a used size against its total, in the total's unit;
 * `n/a of 16.0 GiB` where a figure is not known. */
export function formatUsage(used: number | null, total: number | null): string {
  if (used === null || total === null) {
    return formatOf(used, total);
  }
  const unit = unitFor(total);
  return `${amountIn(used, unit)}/${amountIn(total, unit)} ${unit.name}`;
}

/** `256 MiB of 1024 MiB`, `45.0 GiB free of 100.0 GiB`: both in the total's unit
 * (`n/a` for a figure not known). */
export function formatOf(part: number | null, total: number | null, relation = 'of'): string {
  if (part === null || total === null) {
    return `${formatBytes(part)} ${relation} ${formatBytes(total)}`;
  }
  const unit = unitFor(total);
  return `${formatIn(part, unit)} ${relation} ${formatIn(total, unit)}`;
}

/** How full a disk is as `df`'s "Use%" counts it: used of used and available together. */
export function diskShare(disk: IDiskReading): number | null {
  return share(disk.used, disk.used + disk.available);
}

/** Each role of a disk with its folder, one a line: `home: /root`. */
export function diskFolders(disk: IDiskReading): string {
  return disk.roles.map((role, i) => `${role}: ${disk.paths[i]}`).join('\n');
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

/** The share of `total` that `used` is, in percent; `null` when there is no total or a
 * figure is not known. */
export function share(used: number | null, total: number | null): number | null {
  return used !== null && total !== null && total > 0 ? (100 * used) / total : null;
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

/** `1 core`, `2 cores`, `1.5 cores`. */
export function formatCores(cores: number | null): string {
  if (cores === null) {
    return 'the CPUs';
  }
  return `${cores} ${cores === 1 ? 'core' : 'cores'}`;
}
