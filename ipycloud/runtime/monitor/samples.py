"""One reading of the machine's resources, as the background sampler takes it every second.

Sizes are bytes, percentages 0-100, temperatures degrees Celsius, power watts, times
``time.time()`` seconds. A figure the machine cannot give is None.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU: NVML's figures, and torch's caching allocator when torch already uses CUDA."""

    index: int  # the CUDA ordinal as this process sees it
    name: str
    utilization: float | None
    memory_used: int | None
    memory_total: int | None
    temperature: float | None
    power_draw_w: float | None
    power_limit_w: float | None
    torch_allocated: int | None = None  # torch.cuda.memory_allocated(index)
    torch_reserved: int | None = None  # torch.cuda.memory_reserved(index)

    @property
    def memory_fraction(self) -> float | None:
        """Used over total memory, 0-1."""
        if self.memory_used is None or not self.memory_total:
            return None
        return self.memory_used / self.memory_total


@dataclass(frozen=True, slots=True)
class DiskSample:
    """One file system holding folders that matter (``working``, ``persistent``...), with
    ``df``'s figures: its size, what is used, and what a user can still write."""

    roles: tuple[str, ...]  # of the folders on it, e.g. ("home", "scratch")
    paths: tuple[str, ...]  # the folder of each role, in the same order
    total: int  # the file system's size (statvfs f_blocks)
    used: int  # the size less the free blocks (f_bfree), as df counts "Used"
    available: int  # what a user without privileges can still write (f_bavail): df's "Avail"

    @property
    def name(self) -> str:
        """The roles as one name: ``home, scratch``."""
        return ", ".join(self.roles)

    @property
    def percent(self) -> float | None:
        """df's "Use%": used over what used and available add up to (blocks kept for root
        left out), 0-100; None for an empty file system."""
        usable = self.used + self.available
        return self.used / usable * 100 if usable else None


@dataclass(frozen=True, slots=True)
class Sample:
    """Everything one tick of the sampler reads."""

    time: float
    cpu_percent: float  # of the CPUs this process may use, 0-100
    ram_used: int  # by the container when a cgroup limit applies, else by the host
    ram_limit: int  # the cgroup limit, else the host's physical memory
    ram_available: int  # what can still be allocated under that limit
    swap_used: int
    swap_total: int
    process_rss: int  # this kernel process's resident memory
    disks: tuple[DiskSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    ram_limited: bool = False  # whether ram_limit is the container's cgroup limit
    platform: str | None = None  # the detected platform's name, e.g. "Kaggle"

    @property
    def ram_fraction(self) -> float:
        """Used over the limit, 0-1."""
        return self.ram_used / self.ram_limit if self.ram_limit else 0.0
