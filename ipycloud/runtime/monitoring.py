"""Monitoring for the whole session: the shared sampler running, its usage totals kept."""

from __future__ import annotations

import threading

from ipycloud.runtime.sampler import Sampler, Subscription, shared_sampler
from ipycloud.runtime.usage import shared_tracker

_lock = threading.Lock()
_tracking: Subscription | None = None


def start_monitoring(interval: float | None = None) -> Sampler:
    """Start (or keep) the process's sampler and total its samples for ``usage_report()``.

    ``interval`` (seconds) is the most time allowed between two samples; dashboards may
    ask for more frequent ones. Calling it again is harmless.
    """
    global _tracking
    sampler = shared_sampler()
    with _lock:
        current = _tracking
        if current is None or not current.active or interval not in (None, current.interval):
            if current is not None:
                current.cancel()
            _tracking = shared_tracker().attach(sampler, interval=interval)
    return sampler


def stop_monitoring() -> None:
    """Stop totalling samples; the sampler stops once no dashboard uses it either."""
    global _tracking
    with _lock:
        if _tracking is not None:
            _tracking.cancel()
            _tracking = None
