"""What the container really gets: memory and CPU limits read from the cgroup file system.

A notebook in Docker or Kubernetes sees the host's RAM and cores in ``/proc``; the limits
it actually runs under live in ``/sys/fs/cgroup``. Both cgroup v2 (one unified tree) and
v1 (one tree per controller) are read. Nothing here raises: a missing, unreadable or
garbled file gives a None field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

from ipycloud.runtime._files import is_dir, is_file, read_text

_MOUNT = "sys/fs/cgroup"
_SELF_CGROUP = "proc/self/cgroup"
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit value (9223372036854771712);
# anything this large is not a real limit.
_V1_UNLIMITED = 2**60
_V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")

_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class CgroupLimits:
    """Memory and CPU limits of the cgroup this process runs in."""

    version: int | None  # 2, 1, or None when no cgroup file system is visible
    memory_limit: int | None  # bytes; None when unlimited or unknown
    memory_usage: int | None  # bytes currently charged to the cgroup; None when unknown
    cpu_limit: float | None  # cores = quota / period; None when unlimited or unknown

    def to_dict(self) -> dict[str, object]:
        """The limits as a JSON-ready dict."""
        return asdict(self)


def read_cgroup_limits(root: str | os.PathLike[str] = "/") -> CgroupLimits:
    """Read the limits of this process's cgroup; ``root`` redirects where files are looked up."""
    base = Path(root)
    mount = base / _MOUNT
    if is_file(mount / "cgroup.controllers"):
        return _read_v2(mount, read_text(base / _SELF_CGROUP) or "")
    return _read_v1(mount, read_text(base / _SELF_CGROUP) or "")


def _read_v2(mount: Path, self_cgroup: str) -> CgroupLimits:
    """Take the tightest limit found from the process's cgroup folder up to the mount top."""
    folders = _v2_folders(mount, self_cgroup)
    usages = (_parse_count(read_text(folder / "memory.current")) for folder in folders)
    return CgroupLimits(
        version=2,
        memory_limit=_tightest(_parse_count(read_text(f / "memory.max")) for f in folders),
        memory_usage=next((usage for usage in usages if usage is not None), None),
        cpu_limit=_tightest(_parse_cpu_max(read_text(f / "cpu.max")) for f in folders),
    )


def _v2_folders(mount: Path, self_cgroup: str) -> list[Path]:
    """The process's cgroup folder and each parent up to the mount top, leaf first."""
    relative = next((line[3:] for line in self_cgroup.splitlines() if line.startswith("0::")), "/")
    parts = _safe_parts(relative)
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read_v1(mount: Path, self_cgroup: str) -> CgroupLimits:
    """Read the memory and cpu controllers, each in its own tree."""
    paths = _v1_paths(self_cgroup)
    memory = _v1_folder(mount, ("memory",), paths.get("memory", "/"))
    cpu = _v1_folder(mount, _V1_CPU_MOUNTS, paths.get("cpu", "/"))
    if memory is None and cpu is None:
        return CgroupLimits(version=None, memory_limit=None, memory_usage=None, cpu_limit=None)
    limit = _parse_count(read_text(memory / "memory.limit_in_bytes")) if memory else None
    return CgroupLimits(
        version=1,
        memory_limit=limit if limit is not None and limit < _V1_UNLIMITED else None,
        memory_usage=_parse_count(read_text(memory / "memory.usage_in_bytes")) if memory else None,
        cpu_limit=_v1_cpu_limit(cpu) if cpu else None,
    )


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


def _tightest(values: Iterable[_N | None]) -> _N | None:
    """The smallest of the known values, or None when no level sets one."""
    return min((value for value in values if value is not None), default=None)


def _safe_parts(cgroup_path: str) -> list[str]:
    """Path components of a cgroup path, without anything that could climb out of the mount."""
    return [part for part in PurePosixPath(cgroup_path).parts if part not in ("/", ".", "..")]
