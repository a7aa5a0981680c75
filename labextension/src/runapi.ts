/**
 * The JSON answers of the server's run routes: `runs` and `runs/<id>?since=T`.
 *
 * A run's record is a list of lines, each with `t` (Unix seconds) and `kind`; a figure the
 * run does not know is `null` or absent.
 */

/** A run as the server sums it up. */
export interface IRunSummary {
  id: string;
  /** running | restarting | paused | finished | failed | stopped early | lost */
  status: string;
  notebook: string | null;
  /** Where the run is written now (torchrun may restart it on another node). */
  host: string | null;
  /** Whether `host` is another machine than the server's. */
  remote: boolean;
  pid: number | null;
  kernel: string | null;
  folder: string | null;
  log: string;
  started: number;
  updated: number;
  step: number;
  total_steps: number | null;
  epoch: number;
  epochs: number | null;
  steps_per_s: number | null;
  eta_s: number | null;
  session_left_s: number | null;
  last_loss: number | null;
  best: { metric: string; value: number; epoch: number } | null;
  /** Why the run ended as it did (failed, paused, stopped early), else `null`. */
  reason: string | null;
  events: number;
  checkpoints: number;
  device: string | null;
  model: string | null;
}

export interface IRuns {
  runs: IRunSummary[];
}

/** One line of a run's record; the fields beyond `t` and `kind` depend on the kind. */
export interface IRunRecord {
  t: number;
  kind: 'start' | 'step' | 'epoch' | 'checkpoint' | 'event' | 'end' | string;
  [field: string]: unknown;
}

export interface IRunAnswer {
  run: IRunSummary;
  records: IRunRecord[];
}
