"""Readings of this machine for the sampler: CPU, RAM and swap, disks, process RSS, GPUs.

``take_sample()`` is the sampler's default probe. It reads psutil, the cgroup files and NVML
in-process: no subprocess per sample. CPU and RAM are measured against the container's cgroup
limits where there are any. It never imports torch; torch's CUDA allocator figures are added
only when torch is already imported and has initialised CUDA.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from ipycloud.runtime.machine.cgroup import (
    CgroupCpuTime,
    CgroupLimits,
    container_memory,
    read_cgroup,
)
from ipycloud.runtime.machine.cuda_start import initialised_torch_cuda
from ipycloud.runtime.machine.nvml import GpuReader, LiveGpu
from ipycloud.runtime.machine.platform import Platform, detect_platform
from ipycloud.runtime.machine.snapshot import usable_cpus
from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.monitor.samples import DiskSample, GpuSample, Sample
from ipycloud.runtime.per_process import per_process

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

    def __init__(self, limits: CgroupLimits, usage: CgroupCpuTime | None,
                 clock: Callable[[], float]) -> None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._cpus = allowed if allowed and len(allowed) < (psutil.cpu_count() or 1) else None
        self._clock = clock
        self._usage = usage if limits.cpu_limit else None
        self._capacity = usable_cpus(limits) or 1.0  # cores under the limit (unused without)
        first = self._read()
        if first is None:  # no readable counter: the CPUs of the host it is
            self._usage, first = None, self._read()
        self._last: tuple[float, float, float] = first or (clock(), 0.0, 0.0)  # host: never None
        self._percent: float | None = None

    def percent(self, advance: bool = True) -> float:
        """Percent used since the baseline (the first call waits for a short window).

        ``advance`` makes now the next call's baseline; without it the baseline stays, so
        a reading taken between two others does not shorten their window.
        """
        now = self._read()
        if now is not None and now[0] - self._last[0] < _MIN_CPU_WINDOW_S:
            if self._percent is not None:
                return self._percent
            time.sleep(_MIN_CPU_WINDOW_S - (now[0] - self._last[0]))
            now = self._read()
        if now is None:  # the cgroup counter could not be read: keep the last figure
            return self._percent or 0.0
        (then, busy_then, total_then), (at, busy, total) = self._last, now
        if self._usage is not None:  # busy: the counter in seconds; total: unused
            share = (busy - busy_then) / (at - then) / self._capacity
        else:
            share = (busy - busy_then) / max(total - total_then, 1e-9)
        percent = min(max(share * 100, 0.0), 100.0)
        if advance:
            self._last, self._percent = now, percent
        return percent

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
    ``working`` is the folder whose disk is the working one (default: the current folder
    at each reading), ``persistent`` the persistent one (default: the platform's; left out
    while it does not exist). ``platform`` is the platform detected already, if any.
    """

    def __init__(self, root: str | os.PathLike[str] = "/",
                 clock: Callable[[], float] = time.monotonic, *,
                 working: str | None = None, persistent: str | None = None,
                 platform: Platform | None = None) -> None:
        base = Path(root)
        limits, usage = read_cgroup(base)
        self._memory_limit = limits.memory_limit
        self._memory = usage.memory if limits.memory_limit is not None else None
        self._cpu = _CpuMeter(limits, usage.cpu_time, clock)
        self.platform = platform or detect_platform(root=base, limits=limits)
        if persistent is None:
            found = self.platform.persistent_dir
            persistent = None if found is None else str(found)
        self._working, self._persistent = working, persistent
        self._process = psutil.Process()
        self._gpus = GpuReader()
        self._lock = threading.Lock()

    def read(self, advance_cpu: bool = True) -> Sample:
        """One Sample. ``advance_cpu=False`` gives the CPU use since the last reading that
        advanced it and leaves that baseline for the next one (the background ticks')."""
        with self._lock:
            now = time.time()
            cpu = self._cpu.percent(advance_cpu)
            total, host_available, swap_total, swap_used = _memory()
            memory = container_memory(total, host_available, self._memory_limit,
                                      None if self._memory is None else self._memory.used())
            return Sample(
                time=now,
                cpu_percent=cpu,
                ram_used=memory.used,
                ram_limit=memory.limit,
                ram_available=memory.available,
                swap_used=swap_used,
                swap_total=swap_total,
                process_rss=self._process.memory_info().rss,
                disks=disks_of((("working", self._working or os.getcwd()),
                              ("persistent", self._persistent))),
                gpus=_with_torch(tuple(_gpu_sample(gpu) for gpu in self._gpus.read())),
                ram_limited=memory.limited,
                platform=self.platform.name,
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


def disks_of(folders: tuple[tuple[str, str | None], ...]) -> tuple[DiskSample, ...]:
    """The file systems of the ``(role, folder)`` pairs whose folder exists, as ``df`` sees
    them: folders on one file system (one device) share its entry, which names each role;
    a folder given twice counts once, under its first role."""
    found: dict[int, tuple[list[str], list[str], os.statvfs_result]] = {}
    for role, path in folders:
        if path is None:
            continue
        try:
            device = os.stat(path).st_dev
            if device not in found:
                found[device] = ([], [], os.statvfs(path))
        except OSError:  # not there (yet: Drive is mounted later) or unreadable
            continue
        roles, paths, _ = found[device]
        if path not in paths:
            roles.append(role)
            paths.append(path)
    return tuple(_disk(tuple(roles), tuple(paths), figures)
                 for roles, paths, figures in found.values())


def _disk(roles: tuple[str, ...], paths: tuple[str, ...],
          figures: os.statvfs_result) -> DiskSample:
    """A file system's figures as df computes them from statvfs."""
    block = figures.f_frsize
    return DiskSample(roles, paths, total=figures.f_blocks * block,
                      used=(figures.f_blocks - figures.f_bfree) * block,
                      available=figures.f_bavail * block)


def _gpu_sample(gpu: LiveGpu) -> GpuSample:
    live = gpu.figures
    return GpuSample(index=gpu.cuda_index, name=gpu.name, utilization=live.utilization_gpu,
                     memory_used=live.memory_used, memory_total=live.memory_total,
                     temperature=live.temperature_c, power_draw_w=live.power_draw_w,
                     power_limit_w=gpu.power_limit_w)


def _with_torch(gpus: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
    """Add torch's caching allocator figures when torch is already imported and uses CUDA."""
    if not gpus:
        return gpus
    try:
        cuda = initialised_torch_cuda()
        if cuda is None:
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
        logger.debug("torch CUDA figures unavailable: %s", describe_error(error))
        return gpus


@per_process()
def _shared_probe() -> Probe:
    """The probe of ``take_sample``: its platform and folders are this process's, read once."""
    return Probe()


def take_sample(advance_cpu: bool = True) -> Sample:
    """One reading of this machine: CPU, RAM under the cgroup limit, swap, disks, RSS, GPUs.

    The disks are those of the current folder and of the detected platform's persistent
    folder. ``advance_cpu=False`` reads without moving the CPU baseline of the background
    ticks (see ``Probe.read``). Never imports torch; reads torch's CUDA allocator figures
    only when torch is already imported and has initialised CUDA.
    """
    return _shared_probe().read(advance_cpu)
