/**
 * The page: a header saying where it stands with the kernel, the run of `fit` it follows
 * (when there is one), then a card per GPU, one for CPU and RAM and one for the disks, each
 * figure with its sparkline over the history window.
 */
import type { IReading } from '../api';
import { element, setAttribute, setText } from '../dom';
import {
  diskFolders,
  diskShare,
  formatDuration,
  formatOf,
  formatPercent,
  level
} from '../format';
import { GpuCard } from '../gpucard';
import { MachineRows } from '../machine';
import { MetricRow } from '../metric';
import { DEFAULT_OPTIONS } from '../settings';
import { Connection, KernelPoller } from './poller';
import type { RunFollower } from './runs';
import { RunSection } from './runview';

/** Percent of a disk's size from which it is shown as nearly full. */
const DISK_WARNING_PERCENT = 90;

export class DashboardPage {
  /** @param root - the element the page is drawn into (the document's body) */
  constructor(private readonly _root: HTMLElement) {
    _root.append(
      element(
        'header',
        { class: 'ipycloud-Page-header' },
        element('h1', {}, 'ipycloud'),
        this._platform,
        this._status,
        this._time
      ),
      this._message,
      this._run.node,
      this._gpuProblem,
      element(
        'main',
        { class: 'ipycloud-Page-cards' },
        this._gpus,
        this._card('CPU and RAM', 'machine', ...this._machine.nodes),
        this._card('Disks', 'disks', this._disks)
      )
    );
  }

  /** Draw what the poller and the run's follower hold now. */
  render(poller: KernelPoller, runs: RunFollower): void {
    this._renderConnection(poller.connection, poller);
    const latest = poller.latest;
    this._run.render(runs, latest?.platform.session_left_s ?? null);
    if (!latest) {
      return;
    }
    const samples = poller.samples;
    setAttribute(this._root, 'data-ipycloud-time', String(latest.time));
    setText(this._time, `as of ${new Date(latest.time * 1000).toLocaleTimeString()}`);
    const name = latest.platform.name;
    setText(this._platform, name ?? '');
    this._renderGpus(samples, latest);
    this._renderMachine(samples, latest);
    this._renderDisks(samples, latest);
  }

  private _card(title: string, name: string, ...children: Node[]): HTMLElement {
    return element(
      'section',
      { class: 'ipycloud-Card', 'data-ipycloud-section': name },
      element('div', { class: 'ipycloud-Card-title' }, title),
      ...children
    );
  }

  private _renderConnection(connection: Connection, poller: KernelPoller): void {
    setAttribute(this._root, 'data-ipycloud-status', connection.state);
    const every = `live · every ${poller.interval} s · last ${formatDuration(poller.history)}`;
    const [status, message] = {
      loading: ['asking the kernel…', ''],
      live: [every, ''],
      retrying: [
        'not answering',
        `No new figures: ${'message' in connection ? connection.message : ''}. Trying again…`
      ],
      gone: [
        'kernel gone',
        "The kernel's dashboard server no longer answers: the kernel exited or restarted, " +
          'or %dashboard stop closed this page. Run %dashboard again for a new one.'
      ],
      refused: [
        'refused',
        "The kernel refused this page's token: it belongs to an earlier dashboard. Run " +
          '%dashboard again for a new one.'
      ]
    }[connection.state];
    setText(this._status, status);
    setText(this._message, message);
  }

  private _renderGpus(samples: readonly IReading[], latest: IReading): void {
    const indices = latest.gpus.map(gpu => gpu.index);
    if (indices.join() !== this._gpuCards.map(card => card.index).join()) {
      this._gpuCards = indices.map(index => new GpuCard(index));
      this._gpus.replaceChildren(...this._gpuCards.map(card => card.node));
    }
    for (const card of this._gpuCards) {
      card.update(samples, DEFAULT_OPTIONS.gpuMemoryWarningPercent);
    }
    setText(this._gpuProblem, latest.gpu_problem ?? (indices.length ? '' : 'No GPU in use.'));
  }

  private _renderMachine(samples: readonly IReading[], latest: IReading): void {
    this._machine.render(samples, latest, DEFAULT_OPTIONS.ramWarningPercent);
  }

  private _renderDisks(samples: readonly IReading[], latest: IReading): void {
    const names = latest.disks.map(disk => disk.name);
    if (names.join() !== [...this._diskRows.keys()].join()) {
      this._diskRows = new Map(names.map(name => [name, new MetricRow(name, `disk-${name}`)]));
      this._disks.replaceChildren(...[...this._diskRows.values()].map(row => row.node));
    }
    for (const disk of latest.disks) {
      const percent = diskShare(disk);
      const row = this._diskRows.get(disk.name);
      row?.node.setAttribute('title', diskFolders(disk));
      row?.update(
        `${formatOf(disk.available, disk.total, 'free of')} (${formatPercent(percent)} used)`,
        samples.map(sample => {
          const then = sample.disks.find(each => each.name === disk.name);
          return then ? diskShare(then) : null;
        }),
        100,
        level(percent, DISK_WARNING_PERCENT)
      );
    }
  }

  private _run = new RunSection();
  private _platform = element('span', { class: 'ipycloud-Page-platform' });
  private _status = element('span', { class: 'ipycloud-Page-status' });
  private _time = element('span', { class: 'ipycloud-Page-time' });
  private _message = element('p', { class: 'ipycloud-Page-message' });
  private _gpuProblem = element('p', { class: 'ipycloud-Card-note' });
  private _gpus = element('div', { class: 'ipycloud-Page-gpus' });
  private _gpuCards: GpuCard[] = [];
  private _machine = new MachineRows();
  private _disks = element('div');
  private _diskRows = new Map<string, MetricRow>();
}
