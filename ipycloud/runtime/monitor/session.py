"""Monitoring for the whole session: the shared sampler running, its usage totals kept."""

from __future__ import annotations

import threading

from ipycloud.runtime.monitor.sampler import Sampler, Subscription, shared_sampler
from ipycloud.runtime.monitor.usage import shared_tracker
from ipycloud.runtime.per_process import per_process


class _Tracking:
    """The shared tracker's hold on the shared sampler, while session monitoring runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.subscription: Subscription | None = None

    def stop(self) -> None:
        with self.lock:
            if self.subscription is not None:
                self.subscription.cancel()
                self.subscription = None


@per_process(close=_Tracking.stop)
def _tracking() -> _Tracking:
    return _Tracking()


def start_monitoring(interval: float | None = None) -> Sampler:
    """Start (or keep) the process's sampler and total its samples for ``usage_report()``.

    ``interval`` (seconds) is the most time allowed between two samples; dashboards may
    ask for more frequent ones. Calling it again is harmless.
    """
    sampler = shared_sampler()
    tracking = _tracking()
    with tracking.lock:
        current = tracking.subscription
        if current is None or not current.active or interval not in (None, current.interval):
            if current is not None:
                current.cancel()
            tracking.subscription = shared_tracker().attach(sampler, interval=interval)
    return sampler


def stop_monitoring() -> None:
    """Stop totalling samples; the sampler stops once no dashboard uses it either."""
    _tracking().stop()
