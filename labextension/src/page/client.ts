/**
 * Requests to the server that served the page: the kernel's dashboard server
 * (ipycloud/runtime/monitor/webpage.py) or the Jupyter server's extension
 * (`<base_url>ipycloud/page`); either way its `api/` routes, next to the page, with the
 * page's token where its address has one (the Jupyter server also takes its login cookie).
 */
import type { IHistory, IReading, IRunAnswer, IRuns } from '../api';

/** How long a request may take before the kernel counts as not answering. */
const TIMEOUT_MS = 10_000;

/**
 * Why a request failed: nothing answers on the kernel's port (or a proxy in front of it
 * says so with a 5xx), the server refused the page's token, the server has no such route or
 * run (404), or another answer.
 */
export type FailureKind = 'unreachable' | 'refused' | 'missing' | 'failed';

export class RequestFailed extends Error {
  constructor(
    readonly kind: FailureKind,
    message: string
  ) {
    super(message);
  }
}

export class KernelClient {
  /** @param token - the server's token, from the page's own address ('' for none) */
  constructor(private readonly _token: string) {}

  /** The sampler's newest reading. */
  reading(): Promise<IReading> {
    return this._get<IReading>('reading', {});
  }

  /** The readings the sampler keeps whose time is after `since` (the kernel's clock). */
  history(since: number): Promise<IHistory> {
    return this._get<IHistory>('history', { since: String(since) });
  }

  /** The runs the server knows of, newest first. */
  runs(): Promise<IRuns> {
    return this._get<IRuns>('runs', {});
  }

  /** One run, with its records written after `since` (the run record's clock). */
  run(id: string, since: number): Promise<IRunAnswer> {
    return this._get<IRunAnswer>(`runs/${encodeURIComponent(id)}`, { since: String(since) });
  }

  private async _get<T>(route: string, query: Record<string, string>): Promise<T> {
    const search = new URLSearchParams(this._token ? { ...query, token: this._token } : query);
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
    let response: Response;
    let text: string;
    try {
      response = await fetch(`api/${route}?${search}`, {
        cache: 'no-store',
        signal: abort.signal
      });
      text = await response.text();
    } catch {
      throw new RequestFailed('unreachable', 'the kernel does not answer');
    } finally {
      clearTimeout(timer);
    }
    if (response.status === 403) {
      throw new RequestFailed('refused', "the kernel refused this page's token");
    }
    if (response.status >= 500) {
      throw new RequestFailed('unreachable', `the kernel's port answers ${response.status}`);
    }
    if (response.status === 404) {
      throw new RequestFailed('missing', message(text) ?? `no route ${route}`);
    }
    if (!response.ok) {
      throw new RequestFailed('failed', message(text) ?? `answer ${response.status}`);
    }
    return JSON.parse(text) as T;
  }
}

/** The API's `{"message": ...}`, if the body is one. */
function message(text: string): string | null {
  try {
    const body = JSON.parse(text) as { message?: unknown };
    return typeof body.message === 'string' ? body.message : null;
  } catch {
    return null;
  }
}
