"""What a process holds that a checkpoint writer could leak, read from ``/proc``: shared
memory, memory files (descriptors and mappings), descriptors, threads, child processes
(multiprocessing's resource tracker left out: Python's, not a writer's).

The regions of background saves are anonymous memory files named
``ipycloud-checkpoint`` (``shared_buffers``); every memory file is counted, whoever made it.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil


@dataclass(frozen=True)
class Held:
    """One reading of a process."""

    rss_shmem_kb: int  # resident shared memory (RssShmem): memory files, shm, tmpfs
    memfd_descriptors: int  # open descriptors of memory files
    memfd_regions: int  # memory files mapped (each counted once)
    memfd_mapped_kb: int  # bytes of memory files mapped
    descriptors: int  # open descriptors of any kind
    threads: int
    children: int  # child processes still running

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def held_by(pid: int) -> Held:
    proc = Path(f"/proc/{pid}")
    status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines()
                  if ":" in line)
    targets = []
    for fd in os.listdir(proc / "fd"):
        with contextlib.suppress(FileNotFoundError):  # closed while listed
            targets.append(os.readlink(proc / "fd" / fd))
    regions: dict[str, int] = {}
    for line in (proc / "maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/memfd:"):
            start, end = (int(address, 16) for address in fields[0].split("-"))
            regions[fields[4]] = regions.get(fields[4], 0) + end - start  # by inode
    children = [child for child in psutil.Process(pid).children()
                if child.status() != psutil.STATUS_ZOMBIE and not _python_helper(child)]
    return Held(rss_shmem_kb=int(status["RssShmem"].split()[0]),
                memfd_descriptors=sum(target.startswith("/memfd:") for target in targets),
                memfd_regions=len(regions), memfd_mapped_kb=sum(regions.values()) // 1024,
                descriptors=len(targets), threads=int(status["Threads"]),
                children=len(children))


def settled(pid: int, timeout: float = 15.0, interval: float = 0.2) -> Held:
    """A reading that stays the same for three readings in a row (what a write in flight
    or a process ending changes settles first); the last one after ``timeout``."""
    deadline = time.monotonic() + timeout
    readings = [held_by(pid)]
    while time.monotonic() < deadline and not (
            len(readings) >= 3 and readings[-1] == readings[-2] == readings[-3]):
        time.sleep(interval)
        readings.append(held_by(pid))
    return readings[-1]


def spread(readings: list[Held]) -> dict[str, dict[str, Any]]:
    """First, last and largest of each figure over ``readings``."""
    figures: dict[str, dict[str, Any]] = {}
    for name in readings[0].as_dict():
        values = [getattr(reading, name) for reading in readings]
        figures[name] = {"first": values[0], "last": values[-1], "max": max(values)}
    return figures


def _python_helper(child: psutil.Process) -> bool:
    """multiprocessing's resource tracker: Python starts it once a process spawns one (a
    fresh rank of ``launch``), and it lives as long as that process; no writer's."""
    with contextlib.suppress(psutil.Error):
        return "multiprocessing.resource_tracker" in " ".join(child.cmdline())
    return False
