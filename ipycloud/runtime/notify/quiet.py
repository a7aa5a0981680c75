"""Apprise called with its logs kept in: every line Apprise and urllib3 log while ipycloud
calls into Apprise (a whole URL at debug level, a topic or a token in a warning) stays out
of the logs; the warnings are kept for the caller, to say why a send failed once the URL's
secrets are scrubbed from them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["quieted"]

_QUIETED_LOGGERS = ("apprise", "urllib3.connectionpool")

_calling = threading.local()  # .heard: Apprise's warnings while this thread calls it, or None


@contextmanager
def quieted() -> Iterator[list[str]]:
    """While in the block, this thread's calls into Apprise log nothing; yields the list
    that gathers the messages of Apprise's warnings and errors (raw: scrub before showing)."""
    _install()
    outer = getattr(_calling, "heard", None)
    heard: list[str] = []
    _calling.heard = heard
    try:
        yield heard
    finally:
        _calling.heard = outer


class _KeptIn(logging.Filter):
    """Drops every line of the quieted loggers logged by a thread inside ``quieted()``,
    noting Apprise's warnings; lines of other threads, and of other loggers, pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        heard = getattr(_calling, "heard", None)
        if heard is None:
            return True
        if record.name == "apprise" and record.levelno >= logging.WARNING:
            heard.append(record.getMessage())
        return False


_FILTER = _KeptIn()


def _install() -> None:
    for name in _QUIETED_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
