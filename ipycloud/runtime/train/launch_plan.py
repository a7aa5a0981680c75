"""The checks and the plan of a launch, made in the notebook process before any rank
starts: how many ranks, which backend, a free port, how many threads each, and how the
ranks start (forked, or fresh where CUDA is already up)."""

from __future__ import annotations

import multiprocessing
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipycloud.runtime.machine.cuda_start import cuda_initialised
from ipycloud.runtime.train.device import usable_gpus
from ipycloud.runtime.train.launch_errors import LaunchError
from ipycloud.runtime.units import counted

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, SpawnContext

BACKENDS = ("gloo", "nccl")
MASTER_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class LaunchPlan:
    """What every worker of one launch is told."""

    nprocs: int
    backend: str
    use_cuda: bool  # one GPU per rank: rank r uses cuda:r
    port: int
    threads: int  # torch intra-op threads per rank
    launcher: int  # the PID of the process that launches: every rank ends with it


def check_launch_arguments(nprocs: int | str, backend: str) -> tuple[int | None, str]:
    """Validate the arguments before anything is probed: (nprocs or None for auto, backend)."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}, "
                         f"got {backend!r}")
    if nprocs == "auto":
        return None, backend
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int or 'auto', got {nprocs!r}")
    return nprocs, backend


CUDA_UP = "CUDA is initialised in this process"  # why ranks start fresh, the usual way
NO_FORK = "this platform cannot fork"


@dataclass(frozen=True)
class RankStart:
    """How the ranks start: forked, or fresh (spawned: they get the function and its
    arguments pickled by value) for the reason ``why``."""

    context: ForkContext | SpawnContext
    why: str | None = None  # None: forked

    @property
    def fresh(self) -> bool:
        return self.why is not None


def rank_start() -> RankStart:
    """Forked ranks, which start at once and share the notebook's memory; fresh ones where
    CUDA is already initialised here (a forked rank cannot use it) or fork is missing."""
    if cuda_initialised():
        return RankStart(multiprocessing.get_context("spawn"), CUDA_UP)
    if "fork" not in multiprocessing.get_all_start_methods():
        return RankStart(multiprocessing.get_context("spawn"), NO_FORK)
    return RankStart(multiprocessing.get_context("fork"))


def plan_launch(nprocs: int | None, backend: str) -> LaunchPlan:
    """The plan for ``nprocs`` ranks (None: one per GPU, else up to two on the CPU) over
    ``backend`` ("auto": NCCL on GPUs, else gloo); LaunchError where NCCL cannot run."""
    gpus, cpus = len(usable_gpus()), _usable_cpus()
    count = nprocs if nprocs is not None else (gpus or min(2, cpus))
    chosen = auto_backend(gpus) if backend == "auto" else backend
    if chosen == "nccl":
        _check_nccl(count, gpus)
    return LaunchPlan(nprocs=count, backend=chosen, use_cuda=0 < count <= gpus,
                 port=_free_port(), threads=max(1, cpus // count), launcher=os.getpid())


def auto_backend(gpus: int) -> str:
    """NCCL where there are GPUs and this torch has it, else gloo."""
    import torch.distributed as dist

    return "nccl" if gpus and dist.is_nccl_available() else "gloo"


def _check_nccl(nprocs: int, gpus: int) -> None:
    import torch
    import torch.distributed as dist

    if not gpus:
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise LaunchError(f"backend 'nccl' needs NVIDIA GPUs, and none is usable here "
                          f"(torch {torch.__version__}, {build}): use backend='gloo'")
    if not dist.is_nccl_available():
        raise LaunchError("this torch build has no NCCL: use backend='gloo'")
    if nprocs > gpus:
        raise LaunchError(f"backend 'nccl' needs one GPU per process: "
                          f"{counted(nprocs, 'process', 'processes')}, "
                          f"{counted(gpus, 'GPU')} visible")


def _usable_cpus() -> int:
    """Whole cores this process may run on (affinity and cgroup quota), at least one."""
    from ipycloud.runtime.machine.snapshot import usable_cpus

    return max(1, int(usable_cpus() or 1))


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((MASTER_ADDR, 0))
        port: int = probe.getsockname()[1]
        return port
