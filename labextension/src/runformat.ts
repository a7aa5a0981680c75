/**
 * A run's figures in words: its progress, its ETA against the session's time left, its
 * latest loss and best metric.
 */
import { formatDuration } from './format';
import type { IRunSummary } from './api';

/** `step 120/1000 · epoch 2/10`, `step 120` when the end is unknown. */
export function formatProgress(run: IRunSummary): string {
  const steps = run.total_steps ? `step ${run.step}/${run.total_steps}` : `step ${run.step}`;
  // The record counts epochs from 0; people count the one under way from 1.
  const epoch = run.epochs ? ` · epoch ${Math.min(run.epoch + 1, run.epochs)}/${run.epochs}` : '';
  return steps + epoch;
}

/** The share of the run done, 0-100; `null` when its end is unknown. */
export function progressPercent(run: IRunSummary): number | null {
  if (!run.total_steps) {
    return null;
  }
  return Math.min(100, (100 * run.step) / run.total_steps);
}

/** How the run's ETA stands against the session's time left. */
export interface IEtaVerdict {
  text: string;
  /** The run will not finish before the session ends. */
  late: boolean;
}

/**
 * `ETA 2 h 10 min — session ends in 1 h 40 min: will not finish`; `null` when the run
 * has no ETA (it is not running, or its end is unknown).
 *
 * @param etaSeconds - the run's ETA
 * @param sessionLeftSeconds - the session's time left, `null` when the platform has no end
 */
export function etaVerdict(
  etaSeconds: number | null,
  sessionLeftSeconds: number | null
): IEtaVerdict | null {
  if (etaSeconds === null || !Number.isFinite(etaSeconds)) {
    return null;
  }
  const eta = `ETA ${formatDuration(etaSeconds)}`;
  if (sessionLeftSeconds === null) {
    return { text: eta, late: false };
  }
  const late = etaSeconds > sessionLeftSeconds;
  const session = `session ends in ${formatDuration(sessionLeftSeconds)}`;
  return { text: `${eta} — ${session}${late ? ': will not finish' : ''}`, late };
}

/** `loss 0.532`, with as many digits as a loss needs. */
export function formatLoss(loss: number | null): string {
  return loss === null ? 'loss n/a' : `loss ${formatFigure(loss)}`;
}

/** `best val_loss 0.401 (epoch 1)`; `''` when the run has no best yet. */
export function formatBest(best: IRunSummary['best']): string {
  if (!best) {
    return '';
  }
  const epoch = best.epoch === null ? '' : ` (epoch ${best.epoch + 1})`;
  return `best ${best.metric} ${formatFigure(best.value)}${epoch}`;
}

/** Four significant digits, and no exponent for the figures a run logs. */
export function formatFigure(value: number): string {
  if (value === 0 || !Number.isFinite(value)) {
    return String(value);
  }
  const magnitude = Math.abs(value);
  return magnitude >= 1e-3 && magnitude < 1e5
    ? String(Number(value.toPrecision(4)))
    : value.toExponential(2);
}

/** `on node-2` for a run written on another machine than the server's; `''` for one here. */
export function runHost(run: IRunSummary): string {
  return run.remote && run.host ? `on ${run.host}` : '';
}

/** What a row calls the run: its notebook, else its id. */
export function runName(run: IRunSummary): string {
  return run.notebook ?? `run ${run.id}`;
}
