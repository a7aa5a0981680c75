"""Usage totals of the session, and the usage and cost report built from them.

How time is weighted: each sample counts for the time until the next one, capped at
``max(max_gap, 3 x the shortest interval seen before)`` (``max_gap`` is 60 s by default),
so a gap in the samples (a suspended laptop, a stopped sampler) counts for the cap at most.
The newest sample counts for the last interval that was within the cap (a lone sample for
no time). Averages are weighted by that time; an average over no time is the peak. A GPU
is idle while its utilisation is below ``IDLE_BELOW_PERCENT``. GPU-hours add up each GPU's
counted time; the estimated cost is the instance's hourly rate times the counted time.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ipycloud.runtime.monitor.samples import GpuSample, Sample
from ipycloud.runtime.per_process import per_process

if TYPE_CHECKING:
    from ipycloud.runtime.monitor.prices import InstancePrice, PriceSource
    from ipycloud.runtime.monitor.sampler import Sampler, Subscription
    from ipycloud.runtime.monitor.usage_report import GpuUsage, UsageReport

MAX_GAP_S = 60.0
IDLE_BELOW_PERCENT = 5.0
NO_SAMPLES = ("no samples recorded yet: start monitoring with "
              "ipycloud.runtime.monitor.session.start_monitoring()")
_GAP_FACTOR = 3


class NoSamplesError(ValueError):
    """A usage report was asked for before any sample was recorded."""


@dataclass
class _Figure:
    """A figure weighted by the time each sample counts for: its weighted sum and peak."""

    total: float = 0.0
    weight: float = 0.0
    peak: float | None = None

    def add(self, value: float | None, weight: float) -> None:
        if value is None or not math.isfinite(value):
            return
        self.total += value * weight
        self.weight += weight
        self.peak = value if self.peak is None else max(self.peak, value)

    @property
    def average(self) -> float | None:
        if self.peak is None:
            return None
        return self.total / self.weight if self.weight else self.peak


@dataclass
class _GpuTotals:
    name: str = ""
    memory_total: int | None = None
    seconds: float = 0.0
    idle_seconds: float = 0.0
    utilization: _Figure = field(default_factory=_Figure)
    memory: _Figure = field(default_factory=_Figure)

    def add(self, gpu: GpuSample, weight: float) -> None:
        self.name, self.memory_total = gpu.name, gpu.memory_total or self.memory_total
        self.seconds += weight
        self.utilization.add(gpu.utilization, weight)
        if gpu.utilization is not None and gpu.utilization < IDLE_BELOW_PERCENT:
            self.idle_seconds += weight
        self.memory.add(gpu.memory_used, weight)


@dataclass
class _Totals:
    first: float = 0.0  # the first sample's time
    end: float = 0.0  # the newest counted sample's time plus the time it counts for
    seconds: float = 0.0
    most_gpus: int = 0
    cpu: _Figure = field(default_factory=_Figure)
    ram: _Figure = field(default_factory=_Figure)
    ram_limit: int = 0  # when RAM use peaked
    gpus: dict[int, _GpuTotals] = field(default_factory=dict)

    def add(self, sample: Sample, weight: float) -> None:
        self.end = sample.time + weight
        self.seconds += weight
        self.most_gpus = max(self.most_gpus, len(sample.gpus))
        self.cpu.add(sample.cpu_percent, weight)
        if self.ram.peak is None or sample.ram_used >= self.ram.peak:
            self.ram_limit = sample.ram_limit
        self.ram.add(sample.ram_used, weight)
        for gpu in sample.gpus:
            self.gpus.setdefault(gpu.index, _GpuTotals()).add(gpu, weight)


class UsageTracker:
    """Running totals of a session's samples, fed one at a time (the samples are not kept:
    O(1) memory); ``add`` may run on the sampler thread while another thread reports."""

    def __init__(self, max_gap: float = MAX_GAP_S) -> None:
        if not (math.isfinite(max_gap) and max_gap > 0):
            raise ValueError(f"max_gap must be a positive number of seconds, got {max_gap!r}")
        self.max_gap = max_gap
        self._lock = threading.Lock()
        self._totals = _Totals()
        self._newest: Sample | None = None  # counted when the next one tells for how long
        self._interval = 0.0  # the last interval within the cap: what the newest counts for
        self._shortest: float | None = None
        self._count = 0

    @property
    def samples(self) -> int:
        """How many samples were added."""
        return self._count

    def add(self, sample: Sample) -> None:
        """Count one sample (samples come oldest first; one from a clock set back counts 0)."""
        with self._lock:
            newest = self._newest
            if newest is None:
                self._totals.first = sample.time
            else:
                gap = max(sample.time - newest.time, 0.0)
                cap = self.max_gap if self._shortest is None else max(
                    self.max_gap, _GAP_FACTOR * self._shortest)
                self._totals.add(newest, min(gap, cap))
                if gap <= cap:
                    self._interval = gap
                if gap > 0:
                    self._shortest = gap if self._shortest is None else min(self._shortest, gap)
            self._newest = sample
            self._count += 1

    def attach(self, sampler: Sampler, *, interval: float | None = None) -> Subscription:
        """Count every sample ``sampler`` takes from now on, one at least every ``interval``
        seconds when given."""
        return sampler.subscribe(self.add, interval=interval)

    def report(self, *, instance: str | None = None,
               prices: PriceSource | None = None) -> UsageReport:
        """The report of what was added so far (see ``usage_report``)."""
        with self._lock:
            if self._newest is None:
                raise NoSamplesError(NO_SAMPLES)
            totals = copy.deepcopy(self._totals)
            totals.add(self._newest, self._interval)
            count = self._count
        return _build(totals, count, instance, prices)


@per_process()
def shared_tracker() -> UsageTracker:
    """The one tracker of this process (``start_monitoring()`` attaches it)."""
    return UsageTracker()


def usage_report(samples: Iterable[Sample] | None = None, *, instance: str | None = None,
                 prices: PriceSource | None = None) -> UsageReport:
    """Session duration, GPU-hours, per-GPU use and the estimated cost of ``samples`` (in
    time order), or of what the shared tracker counted.

    ``instance`` is a price table key such as ``"aws:g5.xlarge"``; without it the instance
    is guessed from the platform and the GPUs (Colab, Kaggle, Paperspace), else the cost is
    left unknown. ``prices`` (a JSON file or a mapping) overrides entries of the table.
    """
    if samples is None:
        return shared_tracker().report(instance=instance, prices=prices)
    tracker = UsageTracker()
    for sample in sorted(samples, key=lambda sample: sample.time):
        tracker.add(sample)
    return tracker.report(instance=instance, prices=prices)


def _build(totals: _Totals, count: int, instance: str | None,
           prices: PriceSource | None) -> UsageReport:
    # Loaded here, not with the tracker: counting samples from %load_ext on needs none of it.
    from ipycloud.runtime.machine.platform import detect_platform
    from ipycloud.runtime.monitor.prices import load_prices
    from ipycloud.runtime.monitor.usage_report import UsageReport

    table = load_prices(prices)
    gpus = tuple(_gpu_usage(index, gpu, table.kind_of(gpu.name, gpu.memory_total))
                 for index, gpu in sorted(totals.gpus.items()))
    price: InstancePrice | None
    if instance is not None:
        price, basis = table.find(instance), "as given"
    else:
        platform = detect_platform()
        price, basis = table.guess(platform.key, platform.name, [gpu.kind for gpu in gpus])
    hours = totals.seconds / 3600
    rule, listed = table.comparable(totals.most_gpus, price.key if price else None)
    return UsageReport(
        started=totals.first, ended=totals.end, duration_s=totals.seconds,
        uncounted_s=max(totals.end - totals.first - totals.seconds, 0.0), samples=count,
        gpu_count=totals.most_gpus, gpu_hours=sum(gpu.seconds for gpu in gpus) / 3600,
        idle_below_percent=IDLE_BELOW_PERCENT, cpu_average_percent=totals.cpu.average,
        cpu_peak_percent=totals.cpu.peak, ram_average=_whole(totals.ram.average),
        ram_peak=_whole(totals.ram.peak), ram_limit=totals.ram_limit, gpus=gpus,
        cost=price.cost(hours) if price else None, cost_basis=basis, comparison_rule=rule,
        comparison=tuple(other.cost(hours) for other in listed), prices_about=table.about,
    )


def _gpu_usage(index: int, gpu: _GpuTotals, kind: str | None) -> GpuUsage:
    from ipycloud.runtime.monitor.usage_report import GpuUsage, fraction

    known = gpu.utilization.weight if gpu.utilization.peak is not None else None
    memory_average, memory_peak = _whole(gpu.memory.average), _whole(gpu.memory.peak)
    return GpuUsage(
        index=index, name=gpu.name, kind=kind, seconds=gpu.seconds,
        utilization_average=gpu.utilization.average, utilization_peak=gpu.utilization.peak,
        idle_seconds=None if known is None else gpu.idle_seconds,
        idle_share=gpu.idle_seconds / known if known else None,
        memory_average=memory_average, memory_peak=memory_peak, memory_total=gpu.memory_total,
        memory_average_percent=fraction(memory_average, gpu.memory_total),
        memory_peak_percent=fraction(memory_peak, gpu.memory_total),
    )


def _whole(value: float | None) -> int | None:
    return None if value is None else round(value)
