"""What a process and its descendants use: how many they are, their RSS, their CPU share and
the GPU memory NVML lists for them.

A Jupyter kernel is a process tree (DataLoader workers, ``torch.multiprocessing`` children,
shell commands), so its use is the tree's. ``TreeMeter.read()`` walks the process table
once per reading, whatever the number of trees, and keeps a baseline per process for CPU
use between readings. GPU memory is attributed by matching NVML's compute-process PIDs to
the tree; NVML gives PIDs as the host sees them, so in a container without the host's PID
namespace nothing may match (the memory is then simply not attributed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

from ipycloud.runtime.machine.nvml import GpuProcess


@dataclass(frozen=True, slots=True)
class GpuShare:
    """The memory a process tree holds on one GPU."""

    gpu: int  # CUDA ordinal as the reading process sees it
    used: int | None  # bytes; None when NVML lists the processes without their memory


@dataclass(frozen=True, slots=True)
class ProcessTree:
    """One process and its descendants at one reading."""

    pid: int
    alive: bool  # False: the root process has ended (all other figures then say so)
    pids: tuple[int, ...]  # the root first, then its descendants
    rss: int | None  # bytes, summed over the tree; None when the root is gone
    cpu_percent: float | None  # of the usable cores, 0-100; None until a second reading
    gpu_memory: tuple[GpuShare, ...] = ()  # GPUs on which the tree holds memory


class TreeMeter:
    """Reads process trees, keeping each process's CPU baseline between readings.

    ``cores`` is how many cores 100% stands for (the cgroup quota, else the usable CPUs).
    Not thread-safe: one meter per thread.
    """

    def __init__(self, cores: float) -> None:
        self._cores = max(cores, 1e-9)
        # pid -> (create time, the psutil handle holding its CPU baseline)
        self._known: dict[int, tuple[float, psutil.Process]] = {}

    def read(self, roots: Mapping[str, int],
             gpus: Iterable[tuple[int, tuple[GpuProcess, ...] | None]] = ()
             ) -> dict[str, ProcessTree]:
        """The tree of each root PID, by the caller's key; ``gpus`` pairs each CUDA ordinal
        with NVML's processes on that GPU (None where it cannot list them)."""
        if not roots:
            self._known.clear()
            return {}
        table = _process_table()
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            children.setdefault(parent, []).append(pid)
        gpu_lists = [(index, processes) for index, processes in gpus if processes]
        trees = {key: self._tree(pid, table, children, gpu_lists) for key, pid in roots.items()}
        seen = {pid for tree in trees.values() for pid in tree.pids}
        self._known = {pid: known for pid, known in self._known.items() if pid in seen}
        return trees

    def _tree(self, root: int, table: Mapping[int, tuple[int, float]],
              children: Mapping[int, list[int]],
              gpus: list[tuple[int, tuple[GpuProcess, ...]]]) -> ProcessTree:
        if root not in table:
            return ProcessTree(root, alive=False, pids=(), rss=None, cpu_percent=None)
        pids = [root]
        for pid in pids:  # breadth first: the loop reaches the children it appends
            pids.extend(children.get(pid, ()))
        rss, cpu, root_measured = 0, 0.0, False
        for pid in pids:
            figures = self._figures(pid, table[pid][1])
            if figures is None:
                continue
            pid_rss, pid_cpu = figures
            rss += pid_rss
            cpu += pid_cpu or 0.0
            root_measured = root_measured or (pid == root and pid_cpu is not None)
        members = set(pids)
        shares = tuple(GpuShare(index, _total(p.used_memory for p in listed if p.pid in members))
                       for index, listed in gpus if any(p.pid in members for p in listed))
        return ProcessTree(root, alive=True, pids=tuple(pids), rss=rss,
                           cpu_percent=min(cpu / self._cores, 100.0) if root_measured else None,
                           gpu_memory=shares)

    def _figures(self, pid: int, created: float) -> tuple[int, float | None] | None:
        """RSS and CPU percent of one core since the last reading (None on the first);
        None when the process ended or may not be read."""
        known = self._known.get(pid)
        baseline = known[1] if known is not None and known[0] == created else None
        try:
            handle = baseline or psutil.Process(pid)
            with handle.oneshot():
                rss = handle.memory_info().rss
                percent = handle.cpu_percent(None)
        except (psutil.Error, OSError):
            return None
        self._known[pid] = (created, handle)
        return rss, None if baseline is None else percent


def _process_table() -> dict[int, tuple[int, float]]:
    """Every running process's parent PID and create time, from one walk of the process
    table. A zombie has ended (it only waits for its parent to collect its exit status)."""
    table = {}
    for process in psutil.process_iter(["ppid", "create_time", "status"]):
        info = process.info
        if (info.get("ppid") is not None and info.get("create_time") is not None
                and info.get("status") != psutil.STATUS_ZOMBIE):
            table[process.pid] = (info["ppid"], info["create_time"])
    return table


def _total(values: Iterable[int | None]) -> int | None:
    """The sum of the known values; None when none is known."""
    known = [value for value in values if value is not None]
    return sum(known) if known else None
