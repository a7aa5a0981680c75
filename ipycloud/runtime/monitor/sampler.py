"""The background sampler: one daemon thread reading the machine's resources at a steady rate.

Every consumer (dashboards, the usage report, per-cell records) subscribes to the one
``shared_sampler()`` of the process, with the interval it needs; the thread samples at the
shortest interval asked for, keeps a bounded history and hands each subscriber the samples
due at its own interval. A subscriber that raises is removed and reported; nothing kills the thread.
The default probe is ``ipycloud.runtime.monitor.probe.take_sample()``, imported on first use:
its imports (psutil, NVML, cgroups) then run on the sampler's thread, so starting the
sampler costs its caller next to nothing.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial

from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.monitor.samples import Sample
from ipycloud.runtime.per_process import per_process
from ipycloud.runtime.units import format_duration

logger = logging.getLogger(__name__)

SampleCallback = Callable[[Sample], object]

DEFAULT_INTERVAL_S = 1.0
MAX_INTERVAL_S = 3600.0
# A live view (dashboard) of the samples: its fastest pace, and how far back it shows.
VIEW_MIN_INTERVAL_S = 0.1  # faster than a browser can usefully redraw a panel
VIEW_HISTORY_S = 300.0
VIEW_MAX_HISTORY_S = 86400.0
# A sample this close (as a fraction of a subscriber's interval) to the last one it got is
# not sent to it, so each subscriber keeps its own pace while a faster one drives the thread.
PACE_TOLERANCE = 0.9


def check_interval(interval: float, minimum: float | None = None) -> float:
    """The interval as a float, or a one-line ValueError saying what is allowed.

    Any interval above 0 is allowed unless ``minimum`` (inclusive) is given.
    """
    lowest = "above 0 and at most" if minimum is None else f"from {minimum:g} to"
    if (isinstance(interval, bool) or not isinstance(interval, (int, float))
            or not math.isfinite(interval) or not 0 < interval <= MAX_INTERVAL_S
            or (minimum is not None and interval < minimum)):
        raise ValueError(f"interval must be a number of seconds {lowest} "
                         f"{MAX_INTERVAL_S:.0f}, not {interval!r}")
    return float(interval)


def check_view_pace(interval: float, history: float) -> None:
    """ValueError (one line) unless the interval and history suit a live view."""
    check_interval(interval, minimum=VIEW_MIN_INTERVAL_S)
    if not (math.isfinite(history) and interval < history <= VIEW_MAX_HISTORY_S):
        raise ValueError(f"the history must be longer than the interval ({interval:g} s) and "
                         f"at most {format_duration(VIEW_MAX_HISTORY_S)}, not {history:g} s")


def _default_probe(advance_cpu: bool = True) -> Sample:
    """``take_sample()``, imported by its first call."""
    from ipycloud.runtime.monitor.probe import take_sample

    return take_sample(advance_cpu)


def _check_capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a whole number of samples, at least 1, "
                         f"not {capacity!r}")
    return capacity


class Subscription:
    """One consumer's hold on a Sampler: its callback and the interval it asked for."""

    def __init__(self, sampler: Sampler, callback: SampleCallback,
                 interval: float | None) -> None:
        self.interval = interval
        self.callback = callback
        self.active = True
        self.last_sent: float | None = None  # the time of the latest sample it got
        self._sampler = sampler

    def wants(self, sample: Sample) -> bool:
        """Whether ``sample`` is due for this subscriber at its own interval."""
        return (self.interval is None or self.last_sent is None
                or sample.time - self.last_sent >= self.interval * PACE_TOLERANCE)

    def cancel(self) -> None:
        """Stop getting samples (idempotent); the thread ends when no subscription is left."""
        self._sampler._remove(self)

    def __repr__(self) -> str:
        state = "active" if self.active else "cancelled"
        every = "default interval" if self.interval is None else f"every {self.interval:g} s"
        return f"<Subscription {_name(self.callback)} {every}, {state}>"


def _name(callback: SampleCallback) -> str:
    return getattr(callback, "__qualname__", None) or repr(callback)


class Sampler:
    """A daemon thread that samples while anyone subscribes, into a bounded history."""

    def __init__(self, interval: float = DEFAULT_INTERVAL_S, capacity: int = 3600,
                 probe: Callable[[], Sample] | None = None) -> None:
        self._default_interval = check_interval(interval)
        self.capacity = _check_capacity(capacity)
        self._probe = probe or _default_probe
        # sample_now() between ticks must not move the CPU baseline of the ticks' probe
        self._probe_now = probe or partial(_default_probe, advance_cpu=False)
        self._history: deque[Sample] = deque(maxlen=self.capacity)
        self._history_lock = threading.Lock()
        self._subscriptions: tuple[Subscription, ...] = ()
        self._changed = threading.Condition()  # subscriptions or the stop signal changed
        self._stop: threading.Event | None = None  # the current thread's stop signal
        self._thread: threading.Thread | None = None
        self._probe_failure: str | None = None
        self.errors: list[str] = []  # one line per subscriber removed for raising

    @property
    def interval(self) -> float:
        """Seconds between samples: the shortest any subscriber asked for, else the default."""
        asked = [sub.interval for sub in self._subscriptions if sub.interval is not None]
        return min(asked, default=self._default_interval)

    @property
    def subscribers(self) -> int:
        """How many subscriptions are active."""
        return len(self._subscriptions)

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def subscribe(self, callback: SampleCallback, *,
                  interval: float | None = None) -> Subscription:
        """Call ``callback(sample)`` on the sampler thread at each sample; starts the thread."""
        subscription = Subscription(self, callback,
                                    None if interval is None else check_interval(interval))
        with self._changed:
            self._subscriptions = (*self._subscriptions, subscription)
            if self._stop is None or self._stop.is_set():
                self._start()
            self._changed.notify_all()
        return subscription

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and cancel every subscription; the history is kept."""
        with self._changed:
            for subscription in self._subscriptions:
                subscription.active = False
            self._subscriptions = ()
            if self._stop is not None:
                self._stop.set()
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def history(self, since: float | None = None) -> list[Sample]:
        """The samples kept, oldest first; with ``since`` (a time.time()), only those after it."""
        with self._history_lock:
            samples = list(self._history)
        return samples if since is None else [sample for sample in samples if sample.time > since]

    def latest(self) -> Sample | None:
        """The newest sample kept, if any."""
        with self._history_lock:
            return self._history[-1] if self._history else None

    def sample_now(self) -> Sample:
        """One reading taken now on the calling thread; not stored, not sent to subscribers.

        With the default probe its CPU figure is the use since the last tick, and the next
        tick's window still starts at that tick.
        """
        return self._probe_now()

    def _start(self) -> None:
        """Start a thread with its own stop signal; the caller holds ``_changed``."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,),
                                        name="ipycloud-sampler", daemon=True)
        self._thread.start()

    def _remove(self, subscription: Subscription) -> None:
        with self._changed:
            if not subscription.active:
                return
            subscription.active = False
            self._subscriptions = tuple(sub for sub in self._subscriptions
                                        if sub is not subscription)
            if not self._subscriptions and self._stop is not None:
                self._stop.set()
            self._changed.notify_all()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self._tick(stop)
            with self._changed:  # an interval change or stop() wakes this wait at once
                while not stop.is_set():
                    remaining = started + self.interval - time.monotonic()
                    if remaining <= 0:
                        break
                    self._changed.wait(remaining)

    def _tick(self, stop: threading.Event) -> None:
        try:
            sample = self._probe()
        except Exception as error:
            failure = f"sampler probe failed: {describe_error(error)}"
            if failure != self._probe_failure:  # once per run of identical failures
                logger.warning(failure, exc_info=error)
            self._probe_failure = failure
            return
        self._probe_failure = None
        with self._history_lock:
            self._history.append(sample)
        for subscription in self._subscriptions:
            if stop.is_set():
                return
            if not subscription.active or not subscription.wants(sample):
                continue
            subscription.last_sent = sample.time
            try:
                subscription.callback(sample)
            except Exception as error:
                self._remove(subscription)
                message = (f"sampler subscriber {_name(subscription.callback)} raised "
                           f"{describe_error(error)}; it no longer gets samples")
                self.errors.append(message)
                logger.warning(message)


@per_process(close=Sampler.stop)
def shared_sampler() -> Sampler:
    """The one sampler of this process, created on first use (1 s, one hour of history)."""
    return Sampler()
