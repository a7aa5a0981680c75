"""Readings of this machine for the sampler: CPU, RAM and swap, disks, process RSS, GPUs.

``take_sample()`` is the sampler's default probe. It reads psutil, the cgroup files and NVML
in-process: no subprocess per sample. CPU and RAM are measured against the container's cgroup
limits where there are any. It never imports torch; torch's CUDA allocator figures are added
only when torch is already imported and has initialised CUDA.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from ipycloud.runtime.cgroup import CgroupCpuTime, cgroup_usage, read_cgroup_limits
from ipycloud.runtime.messages import one_line
from ipycloud.runtime.nvml import GpuReader
from ipycloud.runtime.platform import detect_platform
from ipycloud.runtime.samples import DiskSample, GpuSample, Sample

logger = logging.getLogger(__name__)

# CPU use over less than this is noise; the first reading waits this long for a baseline.
_MIN_CPU_WINDOW_S = 0.1


class _CpuMeter:
    """CPU use between two readings, as a percentage of the CPUs this process may use.

    Under a cgroup CPU limit that is the container's own usage over the limit (other
    tenants of the host do not count); otherwise the busy time of the CPUs in this
    process's affinity mask. Its own baseline, so other callers of psutil.cpu_percent()
    do not shorten its window.
    """

    def __init__(self, cpu_limit: float | None, usage: CgroupCpuTime | None,
                 clock: Callable[[], float]) -> None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        online = psutil.cpu_count() or 1
        self._cpus = allowed if allowed and len(allowed) < online else None  # None: all
        cpus = len(allowed) or online
        self._clock = clock
        self._usage = usage if cpu_limit else None
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
            seconds = self._usage.seconds()
            return None if seconds is None else (at, seconds, 0.0)
        if self._cpus is None:
            return at, *_busy_total(psutil.cpu_times())
        per_cpu = psutil.cpu_times(percpu=True)
        pairs = [_busy_total(per_cpu[cpu]) for cpu in self._cpus if cpu < len(per_cpu)]
        return at, sum(busy for busy, _ in pairs), sum(total for _, total in pairs)


def _busy_total(times: Any) -> tuple[float, float]:
    """Busy and total seconds of psutil cpu_times, counted as psutil.cpu_percent counts them."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


class Probe:
    """Reads Samples of this machine; what can be found once (files, platform, GPUs) is.

    ``root`` redirects where the cgroup and platform files are looked up (for tests).
    The cgroup limits are read once: a container's limits are fixed when it starts.
    """

    def __init__(self, root: str | os.PathLike[str] = "/",
                 clock: Callable[[], float] = time.monotonic) -> None:
        base = Path(root)
        limits = read_cgroup_limits(base)
        usage = cgroup_usage(limits.version, base)
        self._memory_limit = limits.memory_limit
        self._memory = usage.memory if limits.memory_limit is not None else None
        self._cpu = _CpuMeter(limits.cpu_limit, usage.cpu_time, clock)
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
        logger.debug("torch CUDA figures unavailable: %s: %s", type(error).__name__,
                     one_line(error))
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
