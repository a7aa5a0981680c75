/**
 * The runs of `fit` as the `api/runs` routes give them (ipycloud/server/README.md): each
 * run's summary, and the records of its run file (one JSON object a line, each with its
 * time `t` and `kind`).
 */

export interface IBest {
  metric: string;
  value: number;
  epoch: number;
}

export interface IRunSummary {
  id: string;
  status: string;
  notebook: string | null;
  kernel: string | null;
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
  best: IBest | null;
  device: string | null;
  model: string | null;
}

export interface IRunList {
  runs: IRunSummary[];
}

/** A line of the run file: `kind` is start, step, epoch, checkpoint, event or end. */
export interface IRunRecord {
  t: number;
  kind: string;
  [field: string]: unknown;
}

export interface IRunDetail {
  run: IRunSummary;
  records: IRunRecord[];
}
