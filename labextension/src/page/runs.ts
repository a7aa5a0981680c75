/**
 * The page's side of the runs of `fit`: which run it shows (the one running, else the
 * newest; on the Jupyter server's page only those of the page's kernel), its summary, and
 * its step and epoch records, fetched in pieces with `since`.
 */
import { KernelClient, RequestFailed } from './client';
import type { IRunRecord, IRunSummary } from '../api';

/** Statuses of a run that may still move. */
const LIVE = new Set(['running', 'restarting', 'paused']);

/** One logged step of the run. */
export interface IStepRow {
  step: number;
  loss: number | null;
  lr: number | null;
}

/** The validation figures of an epoch, at the step it ended on. */
export interface IEpochRow {
  epoch: number;
  step: number;
  metrics: Record<string, number>;
}

export class RunFollower {
  /**
   * @param _client - how to reach the server
   * @param _kernel - the Jupyter kernel whose runs to show; null: every run the server gives
   * @param _changed - called after an update that brought something new
   */
  constructor(
    private readonly _client: KernelClient,
    private readonly _kernel: string | null,
    private readonly _changed: () => void
  ) {}

  /** The run shown, null while there is none (or the server has no runs to give). */
  get run(): IRunSummary | null {
    return this._run;
  }

  get steps(): readonly IStepRow[] {
    return this._steps;
  }

  get epochs(): readonly IEpochRow[] {
    return this._epochs;
  }

  /** Ask the server for the runs and the new records of the one shown. */
  async update(): Promise<void> {
    if (this._busy || this._unavailable) {
      return;
    }
    this._busy = true;
    try {
      const { runs } = await this._client.runs();
      const chosen = this._choose(runs);
      if (chosen) {
        if (chosen.id !== this._run?.id) {
          this._steps = [];
          this._epochs = [];
          this._since = 0;
        }
        const detail = await this._client.run(chosen.id, this._since);
        this._run = detail.run;
        this._add(detail.records);
      } else {
        this._run = null;
      }
      this._changed();
    } catch (error) {
      // A server without the runs routes has none to show; anything else: try next time.
      this._unavailable = error instanceof RequestFailed && error.kind === 'missing' && !this._run;
    } finally {
      this._busy = false;
    }
  }

  private _choose(runs: readonly IRunSummary[]): IRunSummary | null {
    const mine = this._kernel ? runs.filter(run => run.kernel === this._kernel) : runs;
    const shown = mine.find(run => run.id === this._run?.id);
    if (shown && LIVE.has(shown.status)) {
      return shown;
    }
    return mine.find(run => LIVE.has(run.status)) ?? shown ?? mine[0] ?? null;
  }

  private _add(records: readonly IRunRecord[]): void {
    for (const record of records) {
      this._since = Math.max(this._since, record.t);
      if (record.kind === 'step') {
        this._steps.push({
          step: Number(record.step),
          loss: finite(record.loss),
          lr: finite(record.lr)
        });
      } else if (record.kind === 'epoch') {
        this._epochs.push({
          epoch: Number(record.epoch),
          step: this._steps[this._steps.length - 1]?.step ?? 0,
          metrics: validation(record)
        });
      }
    }
  }

  private _run: IRunSummary | null = null;
  private _steps: IStepRow[] = [];
  private _epochs: IEpochRow[] = [];
  private _since = 0;
  private _busy = false;
  private _unavailable = false;
}

function finite(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

/** The epoch's `val_*` figures that are numbers. */
function validation(record: IRunRecord): Record<string, number> {
  const metrics: Record<string, number> = {};
  for (const [name, value] of Object.entries(record)) {
    const number = finite(value);
    if (name.startsWith('val_') && number !== null) {
      metrics[name] = number;
    }
  }
  return metrics;
}
