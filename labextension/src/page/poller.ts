/**
 * The page's side of the kernel's sampler: the readings of the page's history window, kept
 * up to date at the pace the kernel gives; "gone" once the kernel stopped answering.
 */
import type { IReading } from '../api';
import { KernelClient, RequestFailed } from './client';

/** Requests in a row that find nobody answering before the kernel counts as gone. */
export const FAILURES_BEFORE_GONE = 3;

/** Where the page stands with the kernel. */
export type Connection =
  | { state: 'loading' }
  | { state: 'live' }
  /** A request failed; the next one may succeed. */
  | { state: 'retrying'; message: string }
  /** Nothing answers any more: the kernel exited or restarted, or its server was stopped. */
  | { state: 'gone' }
  /** The server refused the page's token: it is not this page's server any more. */
  | { state: 'refused' };

export class KernelPoller {
  /**
   * @param _client - how to reach the kernel
   * @param history - seconds of readings kept
   * @param _changed - called after each request
   */
  constructor(
    private readonly _client: KernelClient,
    readonly history: number,
    private readonly _changed: () => void
  ) {}

  get connection(): Connection {
    return this._connection;
  }

  /** The readings of the history window, oldest first. */
  get samples(): readonly IReading[] {
    return this._samples;
  }

  get latest(): IReading | null {
    return this._samples[this._samples.length - 1] ?? null;
  }

  /** Seconds between two requests: the kernel sampler's interval. */
  get interval(): number {
    return this._interval;
  }

  /** Ask now, then every interval while the page is visible, until the kernel is gone. */
  start(): void {
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && this._timer !== null) {
        this._schedule(0);
      }
    });
    this._schedule(0);
  }

  private _schedule(delayMs: number): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
    }
    this._timer = setTimeout(() => void this._poll(), delayMs);
  }

  private async _poll(): Promise<void> {
    if (!document.hidden) {
      await this._fetch();
      this._changed();
    }
    const { state } = this._connection;
    if (state === 'gone' || state === 'refused') {
      this._timer = null;
      return;
    }
    this._schedule(this._interval * 1000);
  }

  private async _fetch(): Promise<void> {
    try {
      const last = this.latest;
      if (last) {
        const history = await this._client.history(last.time);
        this._interval = history.interval_s;
        this._append(history.samples);
      } else {
        // The window is measured on the kernel's clock, which need not be this browser's.
        const reading = await this._client.reading();
        const history = await this._client.history(reading.time - this.history);
        this._interval = reading.interval_s;
        this._append(history.samples.length ? history.samples : [reading]);
      }
      this._failures = 0;
      this._connection = { state: 'live' };
    } catch (error) {
      if (error instanceof RequestFailed && error.kind === 'refused') {
        this._connection = { state: 'refused' };
        return;
      }
      const unreachable = error instanceof RequestFailed && error.kind === 'unreachable';
      const message = error instanceof Error ? error.message : String(error);
      this._failures = unreachable ? this._failures + 1 : 0;
      this._connection =
        this._failures >= FAILURES_BEFORE_GONE ? { state: 'gone' } : { state: 'retrying', message };
    }
  }

  private _append(samples: readonly IReading[]): void {
    const last = this.latest;
    const fresh = last ? samples.filter(sample => sample.time > last.time) : samples;
    if (!fresh.length) {
      return;
    }
    this._samples.push(...fresh);
    const oldest = fresh[fresh.length - 1].time - this.history;
    this._samples.splice(0, this._samples.findIndex(sample => sample.time >= oldest));
  }

  private _connection: Connection = { state: 'loading' };
  private _samples: IReading[] = [];
  private _interval = 1;
  private _failures = 0;
  private _timer: ReturnType<typeof setTimeout> | null = null;
}
