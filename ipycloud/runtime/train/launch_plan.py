"""The checks and the plan of a launch, made in the notebook process before any rank is
forked: how many ranks, which backend, a free port, how many threads each."""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipycloud.runtime.train.device import usable_gpus
from ipycloud.runtime.train.launch_errors import LaunchError
from ipycloud.runtime.units import counted

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext

BACKENDS = ("gloo", "nccl")
MASTER_ADDR = "127.0.0.1"
_CUDA_INITIALISED = (
    "CUDA is already initialised in this kernel, so forked workers cannot use it: restart "
    "the kernel and call launch() before anything touches CUDA (typically .cuda(), "
    ".to('cuda'), torch.cuda.current_device() or a CUDA tensor), or run a script with "
    "torchrun and run_under_torchrun()"
)


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


def refuse_after_cuda_init() -> None:
    """LaunchError when torch has initialised CUDA here: forked workers could not use it."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        raise LaunchError(_CUDA_INITIALISED)


def fork_context() -> ForkContext:
    """The fork start method; LaunchError where this platform cannot fork."""
    if "fork" not in multiprocessing.get_all_start_methods():
        raise LaunchError("launch() forks its workers and this platform cannot fork: run a "
                          "script with torchrun and run_under_torchrun() instead")
    return multiprocessing.get_context("fork")


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
