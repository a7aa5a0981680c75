/**
 * The browser's side of the server's sampler: the last hour of readings, the kernels and
 * the kernel deaths, kept up to date by polls that sleep while the tab is hidden and back
 * off while the server does not answer.
 */
import { ServerConnection } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { IPoll, Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ApiError,
  IEvent,
  IEvents,
  IHistory,
  IKernels,
  IReading,
  requestAPI
} from './api';

/** Seconds of readings kept in the browser: the server's ring buffer holds an hour. */
const HISTORY_SECONDS = 3600;

/** Kernel deaths kept for the panel's list. */
const EVENTS_KEPT = 20;

/** The longest wait between two tries while the server does not answer. */
const MAX_BACKOFF_MS = 60_000;

/** Where the monitor stands with the server. */
export type Connection =
  | { state: 'loading' }
  | { state: 'ok' }
  /** The server answers, but not on ipycloud's routes: its server extension is off. */
  | { state: 'missing' }
  | { state: 'error'; message: string };

export class ResourceMonitor implements IDisposable {
  /**
   * @param serverSettings - how to reach the Jupyter server
   * @param interval - seconds between two requests
   */
  constructor(
    private readonly _serverSettings: ServerConnection.ISettings,
    interval: number
  ) {
    const poll = (name: string, factory: () => Promise<void>) =>
      new Poll({
        auto: false,
        factory,
        frequency: frequency(interval),
        name: `ipycloud:${name}`,
        standby: 'when-hidden'
      });
    this._readingPoll = poll('readings', () => this._fetchReadings());
    this._kernelPoll = poll('kernels', () => this._fetchKernels());
    this._eventPoll = poll('events', () => this._fetchEvents());
  }

  /** New readings arrived, or the connection changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** A new kernels table arrived. */
  get kernelsChanged(): ISignal<this, IKernels> {
    return this._kernelsChanged;
  }

  /** Kernel deaths that happened while this page was open, oldest first. */
  get newEvents(): ISignal<this, IEvent[]> {
    return this._newEvents;
  }

  get connection(): Connection {
    return this._connection;
  }

  /** The readings of the last hour, oldest first. */
  get samples(): readonly IReading[] {
    return this._samples;
  }

  get latest(): IReading | null {
    return this._samples[this._samples.length - 1] ?? null;
  }

  get kernels(): IKernels | null {
    return this._kernels;
  }

  /** The latest kernel deaths the server knows of, newest first. */
  get events(): readonly IEvent[] {
    return this._events;
  }

  get isDisposed(): boolean {
    return this._readingPoll.isDisposed;
  }

  /** Seconds between two requests. */
  set interval(seconds: number) {
    for (const poll of this._polls()) {
      poll.frequency = frequency(seconds);
    }
  }

  /** Load the server's history, then follow it. */
  start(): void {
    void this._readingPoll.start();
  }

  /** Ask again after the server extension was found missing. */
  retry(): void {
    this._setConnection({ state: 'loading' });
    this.start();
    this._applyWatchers();
  }

  /**
   * Follow the kernels or the kernel deaths for a reason (`panel`, `notifications`)
   * or stop doing so; each is polled while any reason wants it.
   */
  watch(what: 'kernels' | 'events', reason: string, watch: boolean): void {
    const reasons = this._watchers[what];
    void (watch ? reasons.add(reason) : reasons.delete(reason));
    this._applyWatchers();
  }

  /** Fetch the kernels now, e.g. after one was shut down. */
  refreshKernels(): Promise<void> {
    return this._watchers.kernels.size ? this._kernelPoll.refresh() : Promise.resolve();
  }

  dispose(): void {
    for (const poll of this._polls()) {
      poll.dispose();
    }
    Signal.clearData(this);
  }

  private _applyWatchers(): void {
    const running = this._connection.state !== 'missing';
    for (const [poll, reasons] of [
      [this._kernelPoll, this._watchers.kernels],
      [this._eventPoll, this._watchers.events]
    ] as const) {
      void (running && reasons.size ? poll.start() : poll.stop());
    }
  }

  private _polls(): Poll[] {
    return [this._readingPoll, this._kernelPoll, this._eventPoll];
  }

  private async _fetchReadings(): Promise<void> {
    const last = this.latest;
    await this._request(async () => {
      if (last) {
        const history = await this._get<IHistory>('history', { since: last.time });
        this._append(history.samples);
      } else {
        const history = await this._get<IHistory>('history');
        this._append(
          history.samples.length ? history.samples : [await this._get<IReading>('reading')]
        );
      }
    });
  }

  private async _fetchKernels(): Promise<void> {
    await this._request(async () => {
      this._kernels = await this._get<IKernels>('kernels');
      this._kernelsChanged.emit(this._kernels);
    });
  }

  private async _fetchEvents(): Promise<void> {
    await this._request(async () => {
      const newest = this._events[0];
      // A second of overlap: an event is new by its id, never by its time alone.
      const answer = await this._get<IEvents>(
        'events',
        newest ? { since: newest.time - 1 } : {}
      );
      const fresh = answer.events
        .filter(event => event.id > this._lastEventId)
        .sort((a, b) => a.id - b.id);
      if (!fresh.length) {
        return;
      }
      this._lastEventId = fresh[fresh.length - 1].id;
      this._events = [...fresh].reverse().concat(this._events).slice(0, EVENTS_KEPT);
      if (this._eventsLoaded) {
        this._newEvents.emit(fresh);
      }
      this._changed.emit();
    });
    this._eventsLoaded = true;
  }

  /**
   * Run one request of a poll. A 404 stops every poll (the server extension is not
   * there: asking again every few seconds would only fill the server's log); any other
   * failure is shown and thrown again, so that the poll backs off.
   */
  private async _request(fetch: () => Promise<void>): Promise<void> {
    try {
      await fetch();
      this._setConnection({ state: 'ok' });
    } catch (error) {
      if (error instanceof ApiError && error.missingExtension) {
        this._setConnection({ state: 'missing' });
        for (const poll of this._polls()) {
          void poll.stop();
        }
        return;
      }
      this._setConnection({ state: 'error', message: describe(error) });
      throw error;
    }
  }

  private _get<T>(route: string, query: Record<string, number> = {}): Promise<T> {
    return requestAPI<T>(route, query, this._serverSettings);
  }

  private _append(samples: IReading[]): void {
    const last = this.latest;
    const fresh = last ? samples.filter(sample => sample.time > last.time) : samples;
    if (!fresh.length) {
      return;
    }
    this._samples.push(...fresh);
    const oldest = fresh[fresh.length - 1].time - HISTORY_SECONDS;
    const stale = this._samples.findIndex(sample => sample.time >= oldest);
    this._samples.splice(0, stale);
    this._changed.emit();
  }

  private _setConnection(connection: Connection): void {
    const before = this._connection;
    const same =
      before.state === connection.state &&
      (before.state !== 'error' ||
        (connection.state === 'error' && before.message === connection.message));
    if (!same) {
      this._connection = connection;
      this._changed.emit();
    }
  }

  private _readingPoll: Poll;
  private _kernelPoll: Poll;
  private _eventPoll: Poll;
  private _connection: Connection = { state: 'loading' };
  private _samples: IReading[] = [];
  private _kernels: IKernels | null = null;
  private _events: IEvent[] = [];
  private _lastEventId = -1;
  private _watchers = { kernels: new Set<string>(), events: new Set<string>() };
  private _eventsLoaded = false;
  private _changed = new Signal<this, void>(this);
  private _kernelsChanged = new Signal<this, IKernels>(this);
  private _newEvents = new Signal<this, IEvent[]>(this);
}

function frequency(seconds: number): IPoll.Frequency {
  const interval = Math.round(seconds * 1000);
  return { interval, backoff: true, max: Math.max(interval, MAX_BACKOFF_MS) };
}

function describe(error: unknown): string {
  if (error instanceof ServerConnection.NetworkError) {
    return 'the Jupyter server does not answer';
  }
  if (error instanceof ApiError && error.status === 403) {
    return 'the Jupyter server refused the request: log in again';
  }
  return error instanceof Error ? error.message : String(error);
}
