"""The background sampler: one daemon thread reading the machine's resources at a steady rate.

Every consumer (dashboards, the usage report, per-cell records) subscribes to the one
``shared_sampler()`` of the process, with the interval it needs; the thread samples at the
shortest interval asked for, keeps a bounded history and hands each sample to every
subscriber. A subscriber that raises is removed and reported; nothing kills the thread.
The default probe, ``take_sample()``, reads psutil, the cgroup files and NVML in-process:
no subprocess per sample, and it never imports torch.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from ipycloud.runtime._files import is_file, read_text
from ipycloud.runtime.cgroup import (
    _MOUNT,
    _SELF_CGROUP,
    _parse_count,
    _v1_folder,
    _v1_paths,
    _v2_folders,
    read_cgroup_limits,
)
from ipycloud.runtime.nvml import GpuReader
from ipycloud.runtime.platform import detect_platform
from ipycloud.runtime.samples import DiskSample, GpuSample, Sample

logger = logging.getLogger(__name__)

SampleCallback = Callable[[Sample], object]

MAX_INTERVAL_S = 3600.0
# CPU use over less than this is noise; the first reading waits this long for a baseline.
_MIN_CPU_WINDOW_S = 0.1


def _check_interval(interval: float) -> float:
    """The interval as a float, or a one-line ValueError saying what is allowed."""
    if (isinstance(interval, bool) or not isinstance(interval, (int, float))
            or not math.isfinite(interval) or not 0 < interval <= MAX_INTERVAL_S):
        raise ValueError(f"interval must be a number of seconds above 0 and at most "
                         f"{MAX_INTERVAL_S:.0f}, not {interval!r}")
    return float(interval)


def _check_capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a whole number of samples, at least 1, "
                         f"not {capacity!r}")
    return capacity


def _describe(error: BaseException) -> str:
    """``Type: first line of the message``."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class Subscription:
    """One consumer's hold on a Sampler: its callback and the interval it asked for."""

    def __init__(self, sampler: Sampler, callback: SampleCallback,
                 interval: float | None) -> None:
        self.interval = interval
        self.callback = callback
        self.active = True
        self._sampler = sampler

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

    def __init__(self, interval: float = 1.0, capacity: int = 3600,
                 probe: Callable[[], Sample] | None = None) -> None:
        self._default_interval = _check_interval(interval)
        self.capacity = _check_capacity(capacity)
        self._probe = probe or take_sample
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
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def subscribe(self, callback: SampleCallback, *,
                  interval: float | None = None) -> Subscription:
        """Call ``callback(sample)`` on the sampler thread at each sample; starts the thread."""
        subscription = Subscription(self, callback,
                                    None if interval is None else _check_interval(interval))
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
        """One reading taken now on the calling thread; not stored, not sent to subscribers."""
        return self._probe()

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
            failure = f"sampler probe failed: {_describe(error)}"
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
            if not subscription.active:
                continue
            try:
                subscription.callback(sample)
            except Exception as error:
                self._remove(subscription)
                message = (f"sampler subscriber {_name(subscription.callback)} raised "
                           f"{_describe(error)}; it no longer gets samples")
                self.errors.append(message)
                logger.warning(message)


_shared_lock = threading.Lock()
_shared: Sampler | None = None


def shared_sampler() -> Sampler:
    """The one sampler of this process, created on first use (1 s, one hour of history)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Sampler()
        return _shared


class _CpuMeter:
    """CPU use between two readings, as a percentage of the CPUs this process may use.

    Under a cgroup CPU limit that is the container's own usage over the limit (other
    tenants of the host do not count); otherwise the busy time of the CPUs in this
    process's affinity mask. Its own baseline, so other callers of psutil.cpu_percent()
    do not shorten its window.
    """

    def __init__(self, cpu_limit: float | None, usage_file: Path | None, usage_scale: float,
                 clock: Callable[[], float]) -> None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        online = psutil.cpu_count() or 1
        self._cpus = allowed if allowed and len(allowed) < online else None  # None: all
        cpus = len(allowed) or online
        self._usage_scale = usage_scale  # counter units per second
        self._clock = clock
        self._usage = usage_file if cpu_limit else None
        first = self._read()
        if first is None:  # no readable counter: the CPUs of the host it is
            self._usage, first = None, self._read()
        self._capacity = min(cpus, cpu_limit) if self._usage is not None and cpu_limit else cpus
        self._last: tuple[float, float, float] = first or (clock(), 0.0, 0.0)  # host: never None
        self._percent: float | None = None

    def percent(self) -> float:
        """Percent used since the previous call (the first call waits for a short window)."""
        now = self._read()
        if now is not None and now[0] - self._last[0] < _MIN_CPU_WINDOW_S:
            if self._percent is not None:
                return self._percent
            time.sleep(_MIN_CPU_WINDOW_S - (now[0] - self._last[0]))
            now = self._read()
        if now is None:  # the cgroup counter could not be read: keep the last figure
            return self._percent or 0.0
        (then, busy_then, total_then), (at, busy, total) = self._last, now
        self._last = now
        if self._usage is not None:  # busy: the counter in seconds; total: unused
            cores = (busy - busy_then) / (at - then)
        else:
            cores = (busy - busy_then) / max(total - total_then, 1e-9) * self._capacity
        self._percent = min(max(cores / self._capacity * 100, 0.0), 100.0)
        return self._percent

    def _read(self) -> tuple[float, float, float] | None:
        """(clock, busy seconds, total seconds) now; None when the cgroup counter is unreadable."""
        at = self._clock()
        if self._usage is not None:
            count = _stat_value(read_text(self._usage), "usage_usec")
            return None if count is None else (at, count / self._usage_scale, 0.0)
        if self._cpus is None:
            return at, *_busy_total(psutil.cpu_times())
        per_cpu = psutil.cpu_times(percpu=True)
        pairs = [_busy_total(per_cpu[cpu]) for cpu in self._cpus if cpu < len(per_cpu)]
        return at, sum(busy for busy, _ in pairs), sum(total for _, total in pairs)


def _busy_total(times: Any) -> tuple[float, float]:
    """Busy and total seconds of psutil cpu_times, counted as psutil.cpu_percent counts them."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


def _stat_value(text: str | None, key: str) -> int | None:
    """``key``'s number in a ``key value`` file such as memory.stat, or a bare number file."""
    if text is None:
        return None
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _parse_count(value)
    return None


class _CgroupMemory:
    """The container's memory in use: charged memory less reclaimable page cache.

    That is the working set ``docker stats`` and the kubelet show, and what counts towards
    the OOM killer. The files are found once; each reading opens two small files.
    """

    def __init__(self, usage_file: Path, stat_file: Path, inactive_key: str) -> None:
        self._usage_file, self._stat_file, self._inactive_key = usage_file, stat_file, inactive_key

    def used(self) -> int | None:
        usage = _parse_count(read_text(self._usage_file))
        if usage is None:
            return None
        inactive = _stat_value(read_text(self._stat_file), self._inactive_key) or 0
        return max(usage - inactive, 0)


def _cgroup_files(root: Path, version: int | None) -> tuple[_CgroupMemory | None, Path | None]:
    """The container's memory reader and CPU usage counter file, where they exist."""
    mount, self_cgroup = root / _MOUNT, read_text(root / _SELF_CGROUP) or ""
    if version == 2:
        folders = _v2_folders(mount, self_cgroup)
        memory = next((f for f in folders if is_file(f / "memory.current")), None)
        cpu = next((f / "cpu.stat" for f in folders if is_file(f / "cpu.stat")), None)
        return (None if memory is None else
                _CgroupMemory(memory / "memory.current", memory / "memory.stat",
                              "inactive_file")), cpu
    if version == 1:
        paths = _v1_paths(self_cgroup)
        memory_dir = _v1_folder(mount, ("memory",), paths.get("memory", "/"))
        cpu_dir = _v1_folder(mount, ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"),
                             paths.get("cpuacct", "/"))
        return (None if memory_dir is None else
                _CgroupMemory(memory_dir / "memory.usage_in_bytes", memory_dir / "memory.stat",
                              "total_inactive_file"),
                None if cpu_dir is None else cpu_dir / "cpuacct.usage")
    return None, None


class Probe:
    """Reads Samples of this machine; what can be found once (files, platform, GPUs) is.

    ``root`` redirects where the cgroup and platform files are looked up (for tests).
    The cgroup limits are read once: a container's limits are fixed when it starts.
    """

    def __init__(self, root: str | os.PathLike[str] = "/",
                 clock: Callable[[], float] = time.monotonic) -> None:
        base = Path(root)
        limits = read_cgroup_limits(base)
        memory, cpu_usage = _cgroup_files(base, limits.version)
        self._memory_limit = limits.memory_limit
        self._memory = memory if limits.memory_limit is not None else None
        # cgroup v2 counts CPU time in microseconds (cpu.stat), v1 in nanoseconds.
        self._cpu = _CpuMeter(limits.cpu_limit, cpu_usage,
                              1e6 if limits.version == 2 else 1e9, clock)
        persistent = detect_platform(root=base, limits=limits).persistent_dir
        self._persistent = None if persistent is None else str(persistent)
        self._process = psutil.Process()
        self._gpus = GpuReader()
        self._lock = threading.Lock()

    def read(self, working: str | None = None, persistent: str | None = None) -> Sample:
        """One Sample; ``working`` defaults to the current folder, ``persistent`` to the
        platform's persistent folder (left out while it does not exist)."""
        with self._lock:
            now = time.time()
            cpu = self._cpu.percent()
            total, host_available, swap_total, swap_used = _memory()
            used, limit, available = total - host_available, total, host_available
            if self._memory_limit is not None:
                container_used = self._memory.used() if self._memory is not None else None
                used = used if container_used is None else container_used
                limit = min(self._memory_limit, total)
                available = max(min(limit - used, host_available), 0)
            return Sample(
                time=now,
                cpu_percent=cpu,
                ram_used=used,
                ram_limit=limit,
                ram_available=available,
                swap_used=swap_used,
                swap_total=swap_total,
                process_rss=self._process.memory_info().rss,
                disks=_disks((("working", working or os.getcwd()),
                              ("persistent", persistent or self._persistent))),
                gpus=_with_torch(self._gpus.read()),
            )


_MEMINFO_FIELDS = (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree")


def _memory() -> tuple[int, int, int, int]:
    """Total and available RAM, total and used swap, in bytes.

    On Linux one read of /proc/meminfo: psutil's virtual_memory() and swap_memory() would
    read it twice and /proc/vmstat too, and each file read is a large part of a sample.
    """
    try:
        with open("/proc/meminfo", "rb") as file:
            lines = file.read().splitlines()
        fields = {name: int(rest.split()[0]) * 1024 for name, _, rest in
                  (line.partition(b":") for line in lines) if name in _MEMINFO_FIELDS}
        total, available, swap_total, swap_free = (fields[name] for name in _MEMINFO_FIELDS)
    except (OSError, ValueError, IndexError, KeyError):  # not Linux, or a kernel before 3.14
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        return memory.total, memory.available, swap.total, swap.used
    return total, available, swap_total, swap_total - swap_free


def _disks(folders: tuple[tuple[str, str | None], ...]) -> tuple[DiskSample, ...]:
    """The file system of each folder that exists."""
    disks = []
    for role, path in folders:
        if path is None:
            continue
        try:
            usage = psutil.disk_usage(path)
        except OSError:  # not there (yet: Drive is mounted later) or unreadable
            continue
        disks.append(DiskSample(role, path, usage.total, usage.used, usage.free))
    return tuple(disks)


def _with_torch(gpus: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
    """Add torch's caching allocator figures when torch is already imported and uses CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not gpus:
        return gpus
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return gpus
        count = cuda.device_count()
        with_figures = []
        for gpu in gpus:
            if gpu.index < count:
                # One allocator query per device; memory_allocated/reserved would each make one
                # and flatten it.
                stats = cuda.memory_stats_as_nested_dict(gpu.index)
                gpu = replace(gpu, torch_allocated=stats["allocated_bytes"]["all"]["current"],
                              torch_reserved=stats["reserved_bytes"]["all"]["current"])
            with_figures.append(gpu)
        return tuple(with_figures)
    except Exception as error:  # torch half-imported, or a CUDA error: NVML's figures stand
        logger.debug("torch CUDA figures unavailable: %s", _describe(error))
        return gpus


_probe_lock = threading.Lock()
_probe: Probe | None = None


def take_sample(working: str | None = None, persistent: str | None = None) -> Sample:
    """One reading of this machine: CPU, RAM under the cgroup limit, swap, disks, RSS, GPUs.

    ``working`` defaults to the current folder and ``persistent`` to the detected platform's
    persistent folder. Never imports torch; reads torch's CUDA allocator figures only when
    torch is already imported and has initialised CUDA.
    """
    global _probe
    with _probe_lock:
        if _probe is None:
            _probe = Probe()
    return _probe.read(working, persistent)
