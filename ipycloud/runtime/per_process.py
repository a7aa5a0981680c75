"""State that every front shares, one object per process: made on first use, reset in one call.

The sampler, the usage totals, the session guard, the checkpoint writer of each folder, the
running background syncs and the latest mount are each one object per process, so a
dashboard, a magic, a plain Python call and a server extension all see the same one.
``reset_process_state()`` stops and forgets them all (what a test or a fresh start wants).
A forked child forgets them without closing them: they are its parent's (threads it does
not have, the parent's checkpoint runs), and it makes its own on first use.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.RLock()
_made: dict[Callable[[], Any], Any] = {}
_closers: dict[Callable[[], Any], Callable[[Any], object] | None] = {}


def per_process(close: Callable[[Any], object] | None = None
                ) -> Callable[[Callable[[], T]], Callable[[], T]]:
    """Decorate a factory so that it makes its object once per process.

    ``close(obj)`` is called on it by ``reset_process_state()``.
    """

    def decorate(factory: Callable[[], T]) -> Callable[[], T]:
        _closers[factory] = close

        @wraps(factory)
        def instance() -> T:
            with _lock:
                if factory not in _made:
                    _made[factory] = factory()
                return _made[factory]

        return instance

    return decorate


def _forget_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork
    _made.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def reset_process_state() -> None:
    """Close and forget every per-process object; the next use makes a fresh one."""
    with _lock:
        made = list(_made.items())
        _made.clear()
    for factory, obj in reversed(made):  # the newest first: it may use older ones
        close = _closers[factory]
        if close is not None:
            close(obj)
