/**
 * The JSON answers of ipycloud's server extension, and the one function that asks for them.
 *
 * Their types are generated from the routes' JSON Schemas (src/apitypes.ts).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IErrorBody } from './apitypes';

export type {
  ICpuReading,
  IDiskIoReading,
  IDiskReading,
  IErrorBody,
  IEvent,
  IEvents,
  IGpuReading,
  IHistory,
  IKernel,
  IKernelGpuMemory,
  IKernels,
  IMigInstance,
  INetworkReading,
  IPlatformReading,
  IRamReading,
  IReading,
  IRunAnswer,
  IRunBest,
  IRunRecord,
  IRunSummary,
  IRuns
} from './apitypes';

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
    const body = JSON.parse(text) as Partial<IErrorBody>;
    if (typeof body.message === 'string' && body.message) {
      return body.message;
    }
  } catch {
    // not JSON: e.g. the server's HTML page for an unknown route
  }
  return `${response.status} ${response.statusText}`.trim();
}
