/**
 * The panel's Runs section: each run of `fit` the server knows (`GET runs`) with its
 * status, the machine it trains on where that is another one, progress, ETA against the
 * session's time left, latest loss and best metric, polled while the panel is shown.
 */
import { ServerConnection } from '@jupyterlab/services';
import { lineFormIcon } from '@jupyterlab/ui-components';
import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';

import { ApiError, IRunSummary, IRuns, requestAPI } from './api';
import { element, setAttribute, setChildren, setText } from './dom';
import {
  etaVerdict,
  formatBest,
  formatLoss,
  formatProgress,
  progressPercent,
  runHost,
  runName
} from './runformat';

export class RunsSection implements IDisposable {
  readonly node: HTMLElement;

  /**
   * @param serverSettings - how to reach the Jupyter server
   * @param _openChart - opens the chart view of a run
   */
  constructor(
    serverSettings: ServerConnection.ISettings,
    private readonly _openChart: (run: IRunSummary) => void
  ) {
    this._list = element('div', { class: 'ipycloud-Runs', 'data-ipycloud-runs': '' });
    this._note = element('div', { class: 'ipycloud-Card-note' }, 'Asking the server…');
    this.node = element('div', {}, this._list, this._note);
    this._poll = new Poll({
      auto: false,
      factory: () => this._fetch(serverSettings),
      frequency: { interval: 2000, backoff: true, max: 60_000 },
      name: 'ipycloud:runs',
      standby: 'when-hidden'
    });
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  /** Seconds between two requests. */
  set interval(seconds: number) {
    const interval = Math.round(seconds * 1000);
    this._poll.frequency = { interval, backoff: true, max: Math.max(interval, 60_000) };
  }

  /** Follow the runs (while the panel is shown) or stop. */
  watch(watch: boolean): void {
    void (watch ? this._poll.start() : this._poll.stop());
  }

  dispose(): void {
    this._poll.dispose();
  }

  private async _fetch(serverSettings: ServerConnection.ISettings): Promise<void> {
    try {
      this._render((await requestAPI<IRuns>('runs', {}, serverSettings)).runs);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        // An older ipycloud on the server: asking again would only fill its log.
        setText(this._note, 'This server does not list runs: upgrade ipycloud where it runs.');
        void this._poll.stop();
        return;
      }
      setText(this._note, `No runs: ${error instanceof Error ? error.message : error}`);
      throw error;
    }
  }

  private _render(runs: IRunSummary[]): void {
    const rows = new Map<string, RunRow>();
    for (const run of runs) {
      const row = this._rows.get(run.id) ?? new RunRow(this._openChart);
      row.update(run);
      rows.set(run.id, row);
    }
    setChildren(this._list, [...rows.values()].map(row => row.node));
    this._rows = rows;
    setText(
      this._note,
      runs.length ? '' : 'No run yet: a fit() in a notebook of this server shows here.'
    );
  }

  private _list: HTMLElement;
  private _note: HTMLElement;
  private _poll: Poll;
  private _rows = new Map<string, RunRow>();
}

/** One run; its figures are updated in place. */
class RunRow {
  readonly node: HTMLElement;

  constructor(openChart: (run: IRunSummary) => void) {
    const line = (name: string) => element('div', { 'data-ipycloud-run-field': name });
    this._cells = {
      name: element('span', { class: 'ipycloud-Run-name' }),
      host: element('span', { class: 'ipycloud-Run-host', 'data-ipycloud-run-field': 'host' }),
      status: element('span', { class: 'ipycloud-Run-status' }),
      progress: line('progress'),
      eta: line('eta'),
      metrics: line('metrics')
    };
    this._bar = element('span', { class: 'ipycloud-Meter-fill' });
    const chart = element('button', {
      class: 'jp-Button jp-mod-minimal ipycloud-Run-chart',
      'data-ipycloud-action': 'open-run-chart',
      title: "Open the run's charts"
    });
    chart.append(lineFormIcon.element({ tag: 'span' }));
    chart.addEventListener('click', () => {
      if (this._run) {
        openChart(this._run);
      }
    });
    const { name, host, status, progress, eta, metrics } = this._cells;
    this.node = element(
      'div',
      { class: 'ipycloud-Run' },
      element('div', { class: 'ipycloud-Run-head' }, name, host, status, chart),
      progress,
      element('span', { class: 'ipycloud-Meter ipycloud-Run-meter' }, this._bar),
      eta,
      metrics
    );
  }

  update(run: IRunSummary): void {
    this._run = run;
    const cells = this._cells;
    setAttribute(this.node, 'data-ipycloud-run-id', run.id);
    setAttribute(this.node, 'data-ipycloud-run-status', run.status);
    setAttribute(this.node, 'data-ipycloud-run-step', String(run.step));
    setAttribute(this.node, 'title', runTitle(run));
    setText(cells.name, runName(run));
    setText(cells.host, runHost(run));
    setText(cells.status, run.status);
    setText(cells.progress, formatProgress(run));
    const percent = progressPercent(run);
    this._bar.style.width = `${percent ?? 0}%`;
    const running = run.status === 'running';
    // The session of the run's own machine, which may not be the server's.
    const verdict = running ? etaVerdict(run.eta_s, run.session_left_s) : null;
    // A run that ended says why in the ETA's place.
    setText(cells.eta, verdict?.text ?? (running ? '' : (run.reason ?? '')));
    setAttribute(this.node, 'data-ipycloud-late', verdict?.late ? 'true' : 'false');
    const metrics = [formatLoss(run.last_loss), formatBest(run.best)].filter(Boolean);
    setText(cells.metrics, metrics.join(' · '));
  }

  private _run: IRunSummary | null = null;
  private _bar: HTMLElement;
  private _cells: Record<
    'name' | 'host' | 'status' | 'progress' | 'eta' | 'metrics',
    HTMLElement
  >;
}

/** The row's tooltip: where the run trains and where its record lies. */
function runTitle(run: IRunSummary): string {
  const where = [run.model, run.device, run.host && `on ${run.host}`].filter(Boolean).join(' ');
  return [`run ${run.id}`, where, `record: ${run.log}`].filter(Boolean).join('\n');
}
