/**
 * The dashboard page a kernel serves itself (`%dashboard --web`, and `%dashboard` on
 * Colab), also served by the Jupyter server's extension: the page's address carries the
 * server's token (where the server needs it there), the seconds of history to show and, on
 * the Jupyter server, the kernel whose runs to show.
 */
import { KernelClient } from './client';
import { KernelPoller } from './poller';
import { RunFollower } from './runs';
import { DashboardPage } from './view';

/** Seconds of history without a `history` parameter, as `%dashboard` shows by default. */
const DEFAULT_HISTORY = 300;

const query = new URLSearchParams(window.location.search);
const history = Number(query.get('history'));
const page = new DashboardPage(document.body);
const client = new KernelClient(query.get('token') ?? '');
const runs = new RunFollower(client, query.get('kernel'), () => page.render(poller, runs));
const poller = new KernelPoller(
  client,
  Number.isFinite(history) && history > 0 ? history : DEFAULT_HISTORY,
  () => {
    page.render(poller, runs);
    void runs.update(); // at the readings' pace, one request after the other
    if (poller.connection.state === 'live' && window.parent !== window) {
      // The notebook's output shows this page, in place of its snapshot, once it is live.
      window.parent.postMessage({ ipycloud: 'live' }, '*');
    }
  }
);
page.render(poller, runs);
poller.start();
