/**
 * Where a chart view's data comes from: a run's record (`runs/<id>?since=T`) or the
 * machine's readings (`history?since=T`), each fetched incrementally.
 */
import { ServerConnection } from '@jupyterlab/services';

import { IHistory, IReading, IRunAnswer, IRunRecord, IRunSummary, requestAPI } from './api';
import type { XAxis } from './chart';
import { IChartContent, machineCharts, runCharts } from './chartdata';
import { etaVerdict, formatLoss, formatProgress, runName } from './runformat';

/** Seconds of readings kept: as many as the server keeps. */
const HISTORY_SECONDS = 24 * 3600;

export interface IChartSource {
  /** What the view shows, as the command's arguments that open it again. */
  readonly args: { run?: string };
  /** The tab's title. */
  readonly label: string;
  /** The x axes the charts can be drawn over; the first is the default. */
  readonly axes: readonly XAxis[];
  /** A line above the charts: the run's state, or nothing. */
  readonly summary: string;
  /** Fetch what is new; true when there was something. */
  refresh(): Promise<boolean>;
  charts(axis: XAxis): IChartContent[];
}

/** The charts of a run. */
export class RunSource implements IChartSource {
  readonly axes = ['step', 'time'] as const;

  /**
   * @param runId - the run's id
   * @param _serverSettings - how to reach the Jupyter server
   */
  constructor(
    readonly runId: string,
    private readonly _serverSettings: ServerConnection.ISettings
  ) {}

  get args(): { run: string } {
    return { run: this.runId };
  }

  get label(): string {
    return this._run ? `Run: ${runName(this._run)}` : `Run ${this.runId}`;
  }

  get run(): IRunSummary | null {
    return this._run;
  }

  get summary(): string {
    const run = this._run;
    if (!run) {
      return '';
    }
    const eta = run.status === 'running' ? etaVerdict(run.eta_s, run.session_left_s) : null;
    return [runName(run), run.status, formatProgress(run), eta?.text, formatLoss(run.last_loss)]
      .filter(Boolean)
      .join(' · ');
  }

  async refresh(): Promise<boolean> {
    const last = this._records[this._records.length - 1];
    const query: Record<string, number> = last ? { since: last.t } : {};
    const answer = await requestAPI<IRunAnswer>(
      `runs/${encodeURIComponent(this.runId)}`,
      query,
      this._serverSettings
    );
    const changed =
      answer.records.length > 0 || JSON.stringify(answer.run) !== JSON.stringify(this._run);
    this._run = answer.run;
    this._records.push(...answer.records);
    return changed;
  }

  charts(axis: XAxis): IChartContent[] {
    return runCharts(this._records, axis);
  }

  private _run: IRunSummary | null = null;
  private _records: IRunRecord[] = [];
}

/** The charts of the machine the server runs on. */
export class MachineSource implements IChartSource {
  readonly args = {};
  readonly label = 'Machine';
  readonly axes = ['time'] as const;
  readonly summary = '';

  constructor(private readonly _serverSettings: ServerConnection.ISettings) {}

  async refresh(): Promise<boolean> {
    const last = this._samples[this._samples.length - 1];
    const answer = await requestAPI<IHistory>(
      'history',
      last ? { since: last.time } : {},
      this._serverSettings
    );
    const fresh = last ? answer.samples.filter(sample => sample.time > last.time) : answer.samples;
    this._samples.push(...fresh);
    const oldest = (this._samples[this._samples.length - 1]?.time ?? 0) - HISTORY_SECONDS;
    this._samples.splice(0, this._samples.findIndex(sample => sample.time >= oldest));
    return fresh.length > 0;
  }

  charts(): IChartContent[] {
    return machineCharts(this._samples);
  }

  private _samples: IReading[] = [];
}
