"""Alerts when away: messages about runs and the session sent through Apprise to the URLs a
user configured once (ntfy, Telegram, Slack, Discord, email, webhooks).

``notify(kind, title, body)`` queues a message for every URL of ``<config dir>/notify.json``
and ``$IPYCLOUD_NOTIFY``; it never blocks and never raises. ``fit`` alerts when a run
finishes, fails, pauses or stops early; the session guard before the session limit; the
Jupyter server extension when a kernel dies out of memory.
"""

from __future__ import annotations

import logging

from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.notify.sender import KINDS, Alert, notifier, send_now
from ipycloud.runtime.notify.urls import add_url, all_urls, list_urls, remove_url

__all__ = ["KINDS", "add_url", "configured", "flush", "list_urls", "notify", "remove_url",
           "send_test"]

_log = logging.getLogger(__name__)


def notify(kind: str, title: str, body: str) -> bool:
    """Queue an alert of ``kind`` (one of KINDS) for every configured URL; whether it was
    queued (not when none is configured, or one of its kind went less than a minute ago).
    Never blocks, never raises: a failing notifier is logged, masked."""
    try:
        return configured() and notifier().notify(kind, title, body)
    except Exception as error:
        _log.warning("ipycloud: alert not queued: %s", describe_error(error))
        return False


def configured() -> bool:
    """Whether any URL is configured (an unreadable ``notify.json`` counts as none)."""
    try:
        return bool(all_urls())
    except ValueError as error:
        _log.warning("ipycloud: no alerts: %s", error)
        return False


def flush(timeout: float) -> bool:
    """Wait at most ``timeout`` seconds for the queued alerts to go; whether they all did."""
    return notifier().flush(timeout)


def send_test() -> list[tuple[str, str | None]]:
    """Send a test message to every configured URL now (waiting for each, up to Apprise's
    timeouts); for each, the URL masked and None when it was sent, else why not.
    ValueError (one line) when none is configured, ImportError naming the extra without
    Apprise."""
    if not all_urls():
        raise ValueError("no alert URL is configured: add one first (an Apprise URL such as "
                         "ntfy://ntfy.sh/your-topic)")
    from ipycloud.runtime._optional import require

    require("apprise", "notify")
    return send_now(Alert("test", "ipycloud: test alert", "Alerts from ipycloud reach you here."),
                    log_failures=False)
