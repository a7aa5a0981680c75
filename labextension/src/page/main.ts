/**
 * The dashboard page a kernel serves itself (`%dashboard --web`, and `%dashboard` on
 * Colab): the page's address carries the server's token and the seconds of history to show.
 */
import { KernelClient } from './client';
import { KernelPoller } from './poller';
import { DashboardPage } from './view';

/** Seconds of history without a `history` parameter, as `%dashboard` shows by default. */
const DEFAULT_HISTORY = 300;

const query = new URLSearchParams(window.location.search);
const history = Number(query.get('history'));
const page = new DashboardPage(document.body);
const poller = new KernelPoller(
  new KernelClient(query.get('token') ?? ''),
  Number.isFinite(history) && history > 0 ? history : DEFAULT_HISTORY,
  () => page.render(poller)
);
page.render(poller);
poller.start();
