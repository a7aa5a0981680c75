"""What the container really gets: memory and CPU limits read from the cgroup file system.

A notebook in Docker or Kubernetes sees the host's RAM and cores in ``/proc``; the limits
it actually runs under live in ``/sys/fs/cgroup``. Both cgroup v2 (one unified tree) and
v1 (one tree per controller) are read: ``read_cgroup`` finds the process's folders once and
gives the limits with readers of the usage, which the sampler calls at each sample. Nothing
here raises: a missing, unreadable or garbled file gives a None field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import NamedTuple, TypeVar

from ipycloud.runtime.machine.system_files import is_dir, is_file, read_text

_MOUNT = "sys/fs/cgroup"
_SELF_CGROUP = "proc/self/cgroup"
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit value (9223372036854771712);
# anything this large is not a real limit.
_V1_UNLIMITED = 2**60
_V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
_V1_CPUACCT_MOUNTS = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")

_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class CgroupLimits:
    """Memory and CPU limits of the cgroup this process runs in."""

    version: int | None  # 2, 1, or None when no cgroup file system is visible
    memory_limit: int | None  # bytes; None when unlimited or unknown
    memory_usage: int | None  # bytes the cgroup uses now (its working set); None when unknown
    cpu_limit: float | None  # cores = quota / period; None when unlimited or unknown

    def to_dict(self) -> dict[str, object]:
        """The limits as a JSON-ready dict."""
        return asdict(self)


class CgroupMemory:
    """The container's memory in use: charged memory less reclaimable page cache.

    That is the working set ``docker stats`` and the kubelet show, and what counts towards
    the OOM killer. The files are found once; each reading opens two small files.
    """

    def __init__(self, usage_file: Path, stat_file: Path, inactive_key: str) -> None:
        self._usage_file, self._stat_file, self._inactive_key = usage_file, stat_file, inactive_key

    def used(self) -> int | None:
        """Bytes in use now; None when the usage file cannot be read."""
        usage = _parse_count(read_text(self._usage_file))
        if usage is None:
            return None
        inactive = _stat_value(read_text(self._stat_file), self._inactive_key) or 0
        return max(usage - inactive, 0)


class CgroupCpuTime:
    """The CPU time the container has used since it started, from its usage counter file."""

    def __init__(self, usage_file: Path, per_second: float) -> None:
        self._usage_file, self._per_second = usage_file, per_second  # counter units per second

    def seconds(self) -> float | None:
        """CPU seconds used so far; None when the counter cannot be read."""
        count = _stat_value(read_text(self._usage_file), "usage_usec")
        return None if count is None else count / self._per_second


class CgroupUsage(NamedTuple):
    """Readers of what this process's cgroup uses now; None where its files are not there."""

    memory: CgroupMemory | None
    cpu_time: CgroupCpuTime | None


class Cgroup(NamedTuple):
    """The limits of this process's cgroup and the readers of its usage."""

    limits: CgroupLimits
    usage: CgroupUsage


class ContainerMemory(NamedTuple):
    """RAM as the kernel may have it: under the cgroup limit when one applies, else the host's."""

    used: int  # the container's working set, else what the host uses
    limit: int  # the cgroup limit (at most the host's RAM), else the host's RAM
    available: int  # what can still be allocated under that limit
    limited: bool  # whether ``limit`` is the container's


def container_memory(host_total: int, host_available: int, limit: int | None,
                     used: int | None) -> ContainerMemory:
    """The container's view of RAM from the host's total and available bytes, the cgroup
    ``limit`` and the container's working set ``used`` (the host's use when it is unknown)."""
    host_used = host_total - host_available
    if limit is None:
        return ContainerMemory(host_used, host_total, host_available, limited=False)
    used = host_used if used is None else used
    usable = min(limit, host_total)
    return ContainerMemory(used, usable, max(min(usable - used, host_available), 0),
                           limited=limit <= host_total)


def read_cgroup(root: str | os.PathLike[str] = "/") -> Cgroup:
    """Find this process's cgroup folders once: their limits, and readers of their usage.

    ``root`` redirects where the files are looked up (for tests).
    """
    mount = Path(root) / _MOUNT
    self_cgroup = read_text(Path(root) / _SELF_CGROUP) or ""
    if is_file(mount / "cgroup.controllers"):
        return _read_v2(mount, self_cgroup)
    return _read_v1(mount, self_cgroup)


def read_cgroup_limits(root: str | os.PathLike[str] = "/") -> CgroupLimits:
    """Read the limits of this process's cgroup; ``root`` redirects where files are looked up."""
    return read_cgroup(root).limits


def _read_v2(mount: Path, self_cgroup: str) -> Cgroup:
    """The tightest limit from the process's folder up to the mount top; usage from the
    nearest level that counts it."""
    folders = _v2_folders(mount, self_cgroup)
    memory_dir = next((f for f in folders if is_file(f / "memory.current")), None)
    cpu_stat = next((f / "cpu.stat" for f in folders if is_file(f / "cpu.stat")), None)
    usage = CgroupUsage(
        None if memory_dir is None else
        CgroupMemory(memory_dir / "memory.current", memory_dir / "memory.stat", "inactive_file"),
        None if cpu_stat is None else CgroupCpuTime(cpu_stat, 1e6))  # microseconds
    return Cgroup(CgroupLimits(
        version=2,
        memory_limit=_tightest(_parse_count(read_text(f / "memory.max")) for f in folders),
        memory_usage=None if usage.memory is None else usage.memory.used(),
        cpu_limit=_tightest(_parse_cpu_max(read_text(f / "cpu.max")) for f in folders),
    ), usage)


def _v2_folders(mount: Path, self_cgroup: str) -> list[Path]:
    """The process's cgroup folder and each parent up to the mount top, leaf first."""
    relative = next((line[3:] for line in self_cgroup.splitlines() if line.startswith("0::")), "/")
    parts = _safe_parts(relative)
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read_v1(mount: Path, self_cgroup: str) -> Cgroup:
    """Read the memory, cpu and cpuacct controllers, each in its own tree."""
    paths = _v1_paths(self_cgroup)
    memory_dir = _v1_folder(mount, ("memory",), paths.get("memory", "/"))
    cpu_dir = _v1_folder(mount, _V1_CPU_MOUNTS, paths.get("cpu", "/"))
    if memory_dir is None and cpu_dir is None:
        return Cgroup(CgroupLimits(version=None, memory_limit=None, memory_usage=None,
                                   cpu_limit=None), CgroupUsage(None, None))
    cpuacct_dir = _v1_folder(mount, _V1_CPUACCT_MOUNTS, paths.get("cpuacct", "/"))
    memory = None if memory_dir is None else CgroupMemory(
        memory_dir / "memory.usage_in_bytes", memory_dir / "memory.stat", "total_inactive_file")
    limit = _parse_count(read_text(memory_dir / "memory.limit_in_bytes")) if memory_dir else None
    return Cgroup(CgroupLimits(
        version=1,
        memory_limit=limit if limit is not None and limit < _V1_UNLIMITED else None,
        memory_usage=None if memory is None else memory.used(),
        cpu_limit=_v1_cpu_limit(cpu_dir) if cpu_dir else None,
    ), CgroupUsage(memory, None if cpuacct_dir is None else
                   CgroupCpuTime(cpuacct_dir / "cpuacct.usage", 1e9)))  # nanoseconds


def _v1_paths(self_cgroup: str) -> dict[str, str]:
    """Map each v1 controller to its cgroup path, from lines like ``4:memory:/docker/abc``."""
    paths: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3:
            paths.update(dict.fromkeys(fields[1].split(","), fields[2]))
    return paths


def _v1_folder(mount: Path, names: Iterable[str], cgroup_path: str) -> Path | None:
    """The controller's folder for this process, else its mount top, else None."""
    for name in names:
        top = mount / name
        if is_dir(top):
            leaf = top.joinpath(*_safe_parts(cgroup_path))
            return leaf if is_dir(leaf) else top
    return None


def _v1_cpu_limit(folder: Path) -> float | None:
    """Cores from the CFS quota and period; a quota of -1 (unlimited) does not parse."""
    quota = _parse_count(read_text(folder / "cpu.cfs_quota_us"))
    period = _parse_count(read_text(folder / "cpu.cfs_period_us"))
    return quota / period if quota and period else None


def _parse_cpu_max(text: str | None) -> float | None:
    """Cores from a v2 ``cpu.max`` line such as ``200000 100000``; ``max ...`` is unlimited."""
    fields = (text or "").split()
    if len(fields) != 2:
        return None
    quota, period = (_parse_count(field) for field in fields)
    return quota / period if quota and period else None


def _parse_count(text: str | None) -> int | None:
    """A non-negative decimal integer, or None for "max", "-1", empty or garbage text."""
    stripped = (text or "").strip()
    return int(stripped) if stripped.isascii() and stripped.isdigit() else None


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


def _tightest(values: Iterable[_N | None]) -> _N | None:
    """The smallest of the known values, or None when no level sets one."""
    return min((value for value in values if value is not None), default=None)


def _safe_parts(cgroup_path: str) -> list[str]:
    """Path components of a cgroup path, without anything that could climb out of the mount."""
    return [part for part in PurePosixPath(cgroup_path).parts if part not in ("/", ".", "..")]


class CpuThrottling(NamedTuple):
    """The CFS bandwidth counters of ``cpu.stat``: enforcement periods, and those throttled."""

    periods: int  # nr_periods
    throttled: int  # nr_throttled


def throttled_percent(before: CpuThrottling | None, after: CpuThrottling | None) -> float | None:
    """The share of enforcement periods throttled between two readings, 0-100.

    None when either reading is missing or the counters went back (a new cgroup); 0 when no
    period ran (nothing asked for CPU, so nothing was held back).
    """
    if before is None or after is None:
        return None
    periods, throttled = after.periods - before.periods, after.throttled - before.throttled
    if periods < 0 or throttled < 0:
        return None
    return min(throttled / periods * 100, 100.0) if periods else 0.0


class CgroupCounters:
    """Counters of this process's cgroup that only grow: CPU throttling, the RAM peak and
    the OOM kills. Each read opens one small file; a file that is not there gives None.

    Throttling is read where the binding CPU quota is set (none without a quota); the peak
    and the OOM kills where the memory in use is counted.
    """

    def __init__(self, cpu_stat: Path | None, memory_peak: Path | None,
                 oom_events: Path | None) -> None:
        self._cpu_stat, self._memory_peak, self._oom_events = cpu_stat, memory_peak, oom_events

    def throttling(self) -> CpuThrottling | None:
        """``nr_periods`` and ``nr_throttled`` of ``cpu.stat`` (v2 and v1 alike)."""
        text = None if self._cpu_stat is None else read_text(self._cpu_stat)
        periods = _stat_value(text, "nr_periods")
        throttled = _stat_value(text, "nr_throttled")
        return None if periods is None or throttled is None else CpuThrottling(periods, throttled)

    def memory_peak(self) -> int | None:
        """The most memory the cgroup ever used, in bytes (``memory.peak`` in v2, Linux 5.19
        on; ``memory.max_usage_in_bytes`` in v1)."""
        return None if self._memory_peak is None else _parse_count(read_text(self._memory_peak))

    def oom_kills(self) -> int | None:
        """Processes of the cgroup killed by an OOM killer so far (``oom_kill`` of
        ``memory.events`` in v2, of ``memory.oom_control`` in v1, Linux 4.13 on)."""
        if self._oom_events is None:
            return None
        return _stat_value(read_text(self._oom_events), "oom_kill")


def read_cgroup_counters(root: str | os.PathLike[str] = "/") -> CgroupCounters:
    """Find the files of this process's cgroup counters once; ``root`` as for read_cgroup."""
    mount = Path(root) / _MOUNT
    self_cgroup = read_text(Path(root) / _SELF_CGROUP) or ""
    if is_file(mount / "cgroup.controllers"):
        folders = _v2_folders(mount, self_cgroup)
        memory_dir = next((f for f in folders if is_file(f / "memory.current")), None)
        quotas = [(cores, f) for f in folders
                  if (cores := _parse_cpu_max(read_text(f / "cpu.max"))) is not None]
        quota_dir = min(quotas, key=lambda pair: pair[0])[1] if quotas else None
        return CgroupCounters(
            None if quota_dir is None else quota_dir / "cpu.stat",
            None if memory_dir is None else memory_dir / "memory.peak",
            None if memory_dir is None else memory_dir / "memory.events")
    paths = _v1_paths(self_cgroup)
    memory_dir = _v1_folder(mount, ("memory",), paths.get("memory", "/"))
    cpu_dir = _v1_folder(mount, _V1_CPU_MOUNTS, paths.get("cpu", "/"))
    return CgroupCounters(
        cpu_dir / "cpu.stat" if cpu_dir is not None and _v1_cpu_limit(cpu_dir) else None,
        None if memory_dir is None else memory_dir / "memory.max_usage_in_bytes",
        None if memory_dir is None else memory_dir / "memory.oom_control")
