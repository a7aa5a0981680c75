"""A snapshot of the machine this kernel runs on: platform, CPU, memory, disks, GPUs, software.

Memory and CPU figures account for cgroup limits, so on Colab or Kaggle they say what the
container really gets rather than what the host has. Nothing here raises for a missing
GPU, driver or package: such fields are None.
"""

from __future__ import annotations

import functools
import os
import platform as _platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from ipycloud.runtime.machine import nvml
from ipycloud.runtime.machine.build_support import gpu_problem
from ipycloud.runtime.machine.cgroup import (
    CgroupLimits,
    ContainerMemory,
    container_memory,
    read_cgroup_limits,
)
from ipycloud.runtime.machine.platform import Platform, detect_platform
from ipycloud.runtime.machine.software import SoftwareInfo, probe_software


@dataclass(frozen=True)
class DiskInfo:
    """Space on the file system holding one of the session's folders."""

    role: str  # "working", "persistent" or "scratch"
    path: str
    total: int | None  # bytes; None when the folder does not exist (e.g. Drive not mounted)
    free: int | None


@dataclass(frozen=True)
class HostInfo:
    """CPU, memory and swap, with the container's own limits applied."""

    cpu_model: str | None
    cpu_logical: int | None  # logical CPUs on the host
    cpu_physical: int | None  # physical cores on the host
    cpu_usable: float | None  # cores this process may use: affinity and cgroup quota
    memory_total: int  # bytes on the host
    memory_available: int  # bytes the host can still give
    memory_limit: int | None  # the container's cgroup memory limit, None when unlimited
    swap_total: int
    swap_used: int
    cgroup: CgroupLimits

    @property
    def memory_usable(self) -> int:
        """The RAM this kernel can really have: the host's total or the container's limit."""
        return self._memory().limit

    @property
    def memory_free(self) -> int:
        """Memory still free for this kernel: the tighter of the host's and the container's."""
        return self._memory().available

    def _memory(self) -> ContainerMemory:
        return container_memory(self.memory_total, self.memory_available, self.memory_limit,
                                self.cgroup.memory_usage)


@dataclass(frozen=True)
class Snapshot:
    """Everything ``%gpuinfo`` and ``ipycloud info`` report."""

    platform: Platform
    host: HostInfo
    disks: tuple[DiskInfo, ...]
    gpus: nvml.GpuSnapshot
    software: SoftwareInfo

    @property
    def bf16_supported(self) -> bool | None:
        """All visible GPUs run bfloat16 natively under a CUDA torch; None without a GPU."""
        if not self.gpus.devices:
            return None
        flags = [gpu.supports_bf16 for gpu in self.gpus.devices]
        if None in flags:
            return None
        return all(flags) and self.software.torch.cuda_runtime is not None

    @property
    def build_problems(self) -> tuple[str, ...]:
        """What keeps the installed torch from running on each GPU here, one line each with
        its fix (a GPU it has no kernels for, a driver too old for its CUDA)."""
        torch = self.software.torch
        if torch.version is None or torch.cuda_arches is None:
            return ()
        found = (gpu_problem(gpu, torch.cuda_arches, torch.version, torch.cuda_runtime,
                             self.gpus.cuda_driver_version) for gpu in self.gpus.devices)
        return tuple(dict.fromkeys(filter(None, found)))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping of the whole snapshot."""
        host = asdict(self.host)
        host["memory_usable"] = self.host.memory_usable
        host["memory_free"] = self.host.memory_free
        return {
            "platform": self.platform.to_dict(),
            "host": host,
            "disks": [asdict(disk) for disk in self.disks],
            "gpus": self.gpus.to_dict(),
            "software": self.software.to_dict(),
            "bf16_supported": self.bf16_supported,
            "build_problems": list(self.build_problems),
        }


@functools.lru_cache(maxsize=1)
def cpu_model() -> str | None:
    """The CPU's marketing name from /proc/cpuinfo, else what the OS reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return _platform.processor() or None


def usable_cpus(limits: CgroupLimits | None = None) -> float | None:
    """Cores this process may use: its CPU affinity, capped by the cgroup's CPU quota."""
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        affinity = os.cpu_count()
    quota = (read_cgroup_limits() if limits is None else limits).cpu_limit
    counts = [count for count in (affinity, quota) if count is not None]
    return float(min(counts)) if counts else None


def probe_host(limits: CgroupLimits | None = None) -> HostInfo:
    """CPU, memory and swap of this machine under the container's limits."""
    limits = read_cgroup_limits() if limits is None else limits
    memory = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return HostInfo(
        cpu_model=cpu_model(),
        cpu_logical=psutil.cpu_count(logical=True),
        cpu_physical=psutil.cpu_count(logical=False),
        cpu_usable=usable_cpus(limits),
        memory_total=memory.total,
        memory_available=memory.available,
        memory_limit=limits.memory_limit,
        swap_total=swap.total,
        swap_used=swap.used,
        cgroup=limits,
    )


def probe_disk(role: str, path: str | os.PathLike[str]) -> DiskInfo:
    """Total and free bytes of the file system holding ``path``; None where it does not exist."""
    try:
        usage = psutil.disk_usage(os.fspath(path))
    except OSError:
        return DiskInfo(role, os.fspath(path), None, None)
    return DiskInfo(role, os.fspath(path), usage.total, usage.free)


def probe_disks(platform: Platform) -> tuple[DiskInfo, ...]:
    """The working, persistent and scratch folders, each listed once."""
    folders = {"working": Path.cwd(), "persistent": platform.persistent_dir,
               "scratch": platform.scratch_dir}
    seen: set[Path] = set()
    disks = []
    for role, folder in folders.items():
        if folder is None or folder in seen:
            continue
        seen.add(folder)
        disks.append(probe_disk(role, folder))
    return tuple(disks)


def take_snapshot(with_processes: bool = False) -> Snapshot:
    """Probe everything; ``with_processes`` also lists the processes on each GPU."""
    limits = read_cgroup_limits()
    platform = detect_platform(limits=limits)
    gpus = nvml.snapshot(with_processes=with_processes)
    return Snapshot(
        platform=platform,
        host=probe_host(limits),
        disks=probe_disks(platform),
        gpus=gpus,
        software=probe_software(
            nvml_gpus=None if gpus.unavailable_reason is not None else len(gpus.devices)),
    )
