/**
 * The JSON answers of ipycloud's server extension, and the one function that asks for them.
 *
 * Sizes are bytes, times Unix seconds, percentages 0-100; a figure the machine cannot
 * give is `null`.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface IMigInstance {
  uuid: string;
  memory_used: number;
  memory_total: number;
}

export interface IGpuReading {
  index: number;
  name: string;
  uuid: string;
  utilization_percent: number | null;
  memory_used: number;
  memory_total: number;
  temperature_c: number | null;
  power_w: number | null;
  power_limit_w: number | null;
  mig: IMigInstance[];
}

/** One file system, with `df`'s figures; folders on it share the entry, one role each. */
export interface IDiskReading {
  /** The roles joined: `home, scratch`. */
  name: string;
  roles: string[];
  /** The folder of each role, in the same order. */
  paths: string[];
  used: number;
  /** What a user can still write: df's "Avail". */
  available: number;
  total: number;
}

export interface IReading {
  time: number;
  interval_s: number;
  platform: { name: string; session_left_s: number | null };
  gpu_problem: string | null;
  gpus: IGpuReading[];
  cpu: { percent: number; cores: number; throttled_percent: number | null };
  ram: {
    used: number;
    limit: number;
    limited: boolean;
    peak: number | null;
    swap_used: number;
    swap_total: number;
    /** The Jupyter server's own resident memory; `null` on a kernel's own page. */
    server_rss: number | null;
    /** The resident memory of the server's kernels' process trees; `null` likewise. */
    kernels_rss: number | null;
  };
  disks: IDiskReading[];
  /** Bytes per second since the previous reading; `null` where unknown, absent from an
   * older server. */
  network?: { received_per_s: number | null; sent_per_s: number | null };
  /** Bytes per second read and written by the machine's disks since the previous reading;
   * `null` where unknown, absent from an older server. */
  disk_io?: { read_per_s: number | null; written_per_s: number | null };
}

export interface IHistory {
  interval_s: number;
  samples: IReading[];
}

export interface IKernel {
  id: string;
  name: string | null;
  path: string | null;
  type: string | null;
  execution_state: string | null;
  pid: number | null;
  problem: string | null;
  /** The kernel and its children; `null` before the server saw the process. */
  processes: number | null;
  rss: number | null;
  cpu_percent: number | null;
  gpu_memory: { gpu: number; used: number }[];
}

export interface IKernels {
  gpu_problem: string | null;
  kernels: IKernel[];
}

export interface IEvent {
  id: number;
  time: number;
  kind: string;
  kernel_id: string;
  path: string | null;
  reason: string | null;
  out_of_memory: boolean;
  ram_limit: number | null;
  ram_peak: number | null;
  message: string;
}

export interface IEvents {
  events: IEvent[];
}

/**
 * The server answered with an error status. A 404 on the collection routes means that
 * the server does not know them: ipycloud's server extension is not enabled there.
 */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }

  get missingExtension(): boolean {
    return this.status === 404;
  }
}

/**
 * GET `<base_url>ipycloud/api/<route>` with the page's credentials and return its JSON.
 *
 * @param route - the route under `ipycloud/api/`, e.g. `history`
 * @param query - query parameters, e.g. `{ since: 1732410000.5 }`
 * @param settings - the server connection settings (the application's by default)
 */
export async function requestAPI<T>(
  route: string,
  query: Record<string, number> = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const search = Object.entries(query)
    .map(([name, value]) => `${name}=${encodeURIComponent(String(value))}`)
    .join('&');
  const url =
    URLExt.join(settings.baseUrl, 'ipycloud/api', route) +
    (search ? `?${search}` : '');
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, {}, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  if (!response.ok) {
    throw new ApiError(response.status, errorMessage(response, text));
  }
  return JSON.parse(text) as T;
}

function errorMessage(response: Response, text: string): string {
  try {
    const body = JSON.parse(text) as { message?: unknown };
    if (typeof body.message === 'string' && body.message) {
      return body.message;
    }
  } catch {
    // not JSON: e.g. the server's HTML page for an unknown route
  }
  return `${response.status} ${response.statusText}`.trim();
}
