"""Sending alerts off the caller's thread: one daemon thread per process takes them from a
bounded queue and sends each to every configured URL through Apprise. Whoever alerts (the
training thread, the session guard, the server) never waits and never sees an error; an
alert is dropped when one of its kind went less than ``MIN_INTERVAL_S`` ago, or when the
queue is full (a notifier that hangs holds the thread, never the caller).

Each send is bounded by Apprise's own connect and read timeouts (``?cto=`` and ``?rto=``
in a URL, 4 s each by default). Failures are logged with the URL masked and Apprise's
reason with the URL's secrets scrubbed from it; Apprise's and urllib3's own lines, which
carry whole URLs and topics, are kept out of the logs (``quieted``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ipycloud.runtime.messages import describe_error, scrub
from ipycloud.runtime.notify.quiet import quieted
from ipycloud.runtime.notify.urls import all_urls, instantiate, mask, secret_parts
from ipycloud.runtime.per_process import per_process

__all__ = ["KINDS", "MIN_INTERVAL_S", "Alert", "Notifier", "notifier", "send_now"]

# What an alert is about (the first argument of ``notify``).
KINDS = ("finished", "failed", "paused", "stopped_early", "out_of_memory", "deadline")
MIN_INTERVAL_S = 60.0  # at most one alert of a kind in this time; the others are dropped
QUEUE_SIZE = 32
EXIT_WAIT_S = 5.0  # at interpreter exit, how long alerts still queued may take
THREAD_NAME = "ipycloud-notify"
_SEVERITY = {"finished": "success", "failed": "failure", "out_of_memory": "failure",
             "paused": "warning", "deadline": "warning"}  # Apprise's NotifyType values

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alert:
    """One message: its kind (``KINDS``), a title and a body."""

    kind: str
    title: str
    body: str


class Notifier:
    """The queue, the thread that empties it, and the rate limit by kind.

    ``clock`` gives the seconds the rate limit counts; ``send`` sends one alert (by
    default through Apprise to every configured URL).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 send: Callable[[Alert], object] | None = None) -> None:
        self._clock = clock
        self._send = send or send_now
        self._queue: queue.Queue[Alert | None] = queue.Queue(QUEUE_SIZE)
        self._last: dict[str, float] = {}  # kind -> when its last alert was queued
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def notify(self, kind: str, title: str, body: str) -> bool:
        """Queue an alert unless one of its kind was queued in the last MIN_INTERVAL_S or
        the queue is full; whether it was queued. Never blocks."""
        with self._lock:
            now = self._clock()
            last = self._last.get(kind)
            if last is not None and now - last < MIN_INTERVAL_S:
                return False
            try:
                self._queue.put_nowait(Alert(kind, title, body))
            except queue.Full:
                return False
            self._last[kind] = now
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=THREAD_NAME,
                                                daemon=True)
                self._thread.start()
                atexit.register(self.flush, EXIT_WAIT_S)
        return True

    def flush(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the queued alerts to be sent (or to fail);
        whether they all were."""
        done = self._queue.all_tasks_done
        with done:
            return done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    def close(self) -> None:
        """Stop the thread once it has sent what is queued (waiting at most EXIT_WAIT_S)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        atexit.unregister(self.flush)
        try:
            self._queue.put(None, timeout=EXIT_WAIT_S)
        except queue.Full:
            return  # a notifier that hangs: the daemon thread goes with the process
        thread.join(EXIT_WAIT_S)

    def _loop(self) -> None:
        while True:
            alert = self._queue.get()
            try:
                if alert is None:
                    return
                self._send(alert)
            except Exception as error:  # the thread outlives any failure of a send
                _log.warning("ipycloud: an alert could not be sent: %s", describe_error(error))
            finally:
                self._queue.task_done()


def send_now(alert: Alert, log_failures: bool = True) -> list[tuple[str, str | None]]:
    """Send ``alert`` to every configured URL now, on this thread; for each, the URL masked
    and None when it was sent, else why not (Apprise's warning, logged too unless
    ``log_failures`` is False: the caller says it)."""
    apprise = _apprise()
    if apprise is None:
        return []
    severity = _SEVERITY.get(alert.kind, "info")
    results = []
    for url in all_urls():
        service = instantiate(apprise, url)
        with quieted() as heard:
            sent = service is not None and bool(
                service.notify(body=alert.body, title=alert.title, notify_type=severity))
        problem = None if sent else scrub(heard[0] if heard else "Apprise gave no reason",
                                          secret_parts(url))
        if problem is not None and log_failures:
            _log.warning("ipycloud: the %s alert was not sent to %s: %s", alert.kind,
                         mask(url), problem)
        results.append((mask(url), problem))
    return results


def _apprise() -> Any:
    """Apprise, or None with one warning per process that it is missing."""
    try:
        import apprise
    except ImportError:
        _warn_missing()
        return None
    return apprise


@functools.cache
def _warn_missing() -> None:
    _log.warning("ipycloud: alerts are configured but Apprise is missing: "
                 "pip install 'ipycloud[notify]'")


@per_process(close=Notifier.close)
def notifier() -> Notifier:
    """The alert queue and thread of this process."""
    return Notifier()
