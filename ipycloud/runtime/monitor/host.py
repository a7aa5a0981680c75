"""Readings of the whole machine for a monitor that serves many people at once (the Jupyter
server extension): the probe's Sample plus what a shared view needs besides.

``HostProbe.read()`` takes the probe's reading (CPU and RAM under the cgroup limits, swap,
GPUs) and adds the cgroup's CPU throttling, RAM peak and OOM-kill counter, the network's
traffic, the disks' I/O, each GPU's UUID, MIG instances and processes, the disks of home,
persistent and scratch folders, and the process trees of the PIDs it is asked to watch
(kernels), with the GPU memory each holds.
Everything is read on the calling thread (the sampler's): nothing here is asynchronous.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ipycloud.runtime.machine.cgroup import read_cgroup, read_cgroup_counters, throttled_percent
from ipycloud.runtime.machine.nvml import GpuDetail, GpuDetailReader, unavailable_reason
from ipycloud.runtime.machine.platform import Platform, detect_platform
from ipycloud.runtime.machine.snapshot import usable_cpus
from ipycloud.runtime.monitor.disk_io import DiskIoMeter
from ipycloud.runtime.monitor.network import NetworkMeter
from ipycloud.runtime.monitor.probe import Probe, disks_of
from ipycloud.runtime.monitor.processes import ProcessTree, TreeMeter
from ipycloud.runtime.monitor.samples import Sample
from ipycloud.runtime.units import counted


@dataclass(frozen=True, slots=True)
class HostSample(Sample):
    """A Sample with the figures a shared monitor adds; None where the machine gives none."""

    session_left_s: float | None = None  # until the platform's session limit; None: no limit
    cpu_cores: float | None = None  # usable cores: the cgroup quota, else the CPUs allowed
    cpu_throttled_percent: float | None = None  # periods throttled since the last reading
    ram_peak: int | None = None  # the cgroup's highest use so far; None without its limit
    oom_kills: int | None = None  # the cgroup's OOM-kill counter
    net_received_per_s: float | None = None  # bytes/s since the last reading, no loopback
    net_sent_per_s: float | None = None
    disk_read_per_s: float | None = None  # bytes/s since the last reading, whole disks only
    disk_written_per_s: float | None = None
    gpu_problem: str | None = None  # why no GPU is listed, or why one lists no processes
    gpu_details: tuple[GpuDetail, ...] = ()  # by CUDA ordinal, as ``gpus``
    watched: Mapping[str, ProcessTree] = field(  # by the key each tree was watched as
        default_factory=lambda: MappingProxyType({}))


class HostProbe:
    """Reads HostSamples of this machine; thread-safe (one reading at a time).

    ``root`` redirects where the cgroup and platform marker files are looked up (tests);
    ``home`` is the folder whose disk is shown as home (default: the user's home);
    ``session_start`` (a time.time()) starts the clock of the platform's session limit.
    """

    def __init__(self, root: str | os.PathLike[str] = "/", *,
                 clock: Callable[[], float] = time.monotonic, home: str | None = None,
                 session_start: float | None = None) -> None:
        base = Path(root)
        limits = read_cgroup(base).limits
        self.platform: Platform = detect_platform(root=base, limits=limits)
        persistent = self.platform.persistent_dir
        self._folders = (("home", home or os.path.expanduser("~")),
                         ("persistent", None if persistent is None else str(persistent)),
                         ("scratch", str(self.platform.scratch_dir)))
        self._probe = Probe(base, clock, working=self._folders[0][1],
                            persistent=self._folders[1][1], platform=self.platform)
        self._counters = read_cgroup_counters(base)
        # The peak is the cgroup's: it goes with RAM figures that are the cgroup's too.
        self._peak_applies = limits.memory_limit is not None
        self._throttling = self._counters.throttling()
        self.cores = usable_cpus(limits) or float(os.cpu_count() or 1)
        self._trees = TreeMeter(self.cores)
        self._gpus = GpuDetailReader()
        self._network = NetworkMeter(clock=clock)
        self._disk_io = DiskIoMeter(clock=clock)
        self._session_start = session_start
        self._lock = threading.Lock()

    def read(self, watched: Mapping[str, int] | None = None) -> HostSample:
        """One reading, with the process tree of each ``watched`` root PID (by key).

        Never raises for a figure the machine cannot give.
        """
        with self._lock:
            sample = self._probe.read()
            throttling = self._counters.throttling()
            throttled = throttled_percent(self._throttling, throttling)
            self._throttling = throttling
            received, sent = self._network.read()
            read, written = self._disk_io.read()
            details = self._gpus.read()
            trees = self._trees.read(watched or {}, [(gpu.cuda_index, gpu.processes)
                                                     for gpu in details])
            probed: dict[str, Any] = {name.name: getattr(sample, name.name)
                                      for name in fields(Sample)}
            return HostSample(**{
                **probed,
                "disks": disks_of(self._folders),
                "session_left_s": self._session_left(sample.time),
                "cpu_cores": self.cores,
                "cpu_throttled_percent": throttled,
                "ram_peak": self._ram_peak(),
                "oom_kills": self._counters.oom_kills(),
                "net_received_per_s": received,
                "net_sent_per_s": sent,
                "disk_read_per_s": read,
                "disk_written_per_s": written,
                "gpu_problem": self._gpu_problem(sample, details),
                "gpu_details": details,
                "watched": MappingProxyType(trees),
            })

    def memory_counters(self) -> tuple[int | None, int | None]:
        """The cgroup's OOM-kill counter and RAM peak, read now (any thread)."""
        return self._counters.oom_kills(), self._ram_peak()

    def _ram_peak(self) -> int | None:
        """The cgroup's RAM peak; None when RAM is measured on the host (no cgroup limit)."""
        return self._counters.memory_peak() if self._peak_applies else None

    def _session_left(self, now: float) -> float | None:
        limit = self.platform.session_limit_s
        if limit is None or self._session_start is None:
            return None
        return limit - (now - self._session_start)

    def _gpu_problem(self, sample: Sample, details: tuple[GpuDetail, ...]) -> str | None:
        if sample.gpus:
            unlisted = [detail.cuda_index for detail in details if detail.processes is None]
            if not unlisted:
                return None
            return (f"NVML does not list the processes of GPU "
                    f"{', '.join(map(str, unlisted))}: GPU memory is not shown per kernel")
        reason = unavailable_reason()
        if reason is not None:
            return reason
        if self._gpus.hidden:
            hidden = self._gpus.hidden
            return (f"CUDA_VISIBLE_DEVICES hides {'the' if hidden == 1 else 'all'} "
                    f"{counted(hidden, 'GPU')} from the server")
        return "NVML sees no GPU on this machine"


