"""Run a training function in several processes under torch.distributed, from a notebook.

``launch(train, nprocs=2)`` starts ``nprocs`` workers from the kernel, initialises a process
group in each (rank, world size, a free port on 127.0.0.1) and runs ``train`` there; the
return values come back to the notebook, one per rank. Each worker gets the environment
``torchrun`` gives (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), so code written for torchrun runs unchanged. Workers are forked, which starts
them at once; once CUDA is initialised in the kernel, a forked worker could not use it, so
they start fresh (spawned) and get ``train``, its arguments and what it uses from the
notebook pickled by value: no kernel restart.

Several machines, or a script: the same function runs under ``torchrun``. Put it in a
script that ends with::

    if __name__ == "__main__":
        run_under_torchrun(train, ...)

and start the script on every node, e.g.
``torchrun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --nproc_per_node=8 train.py``.
``run_under_torchrun`` initialises the process group from torchrun's environment (NCCL on
NVIDIA GPUs, gloo otherwise), runs the function and destroys the group;
``distributed_info()`` (and ``fit``) find the group there as they do under ``launch``.

A launch's parts: ``launch_plan`` (the checks and the plan, before any fork),
``rank_processes`` (the ranks with their environment and pipes, stopping them),
``rank_results`` (collecting what they carry back) and ``launch_errors``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ipycloud.runtime._optional import require
from ipycloud.runtime.train.device import usable_gpus
from ipycloud.runtime.train.launch_errors import LaunchError, RemoteTraceback
from ipycloud.runtime.train.launch_plan import (
    auto_backend,
    check_launch_arguments,
    plan_launch,
    rank_start,
)
from ipycloud.runtime.train.rank_processes import (
    RankProcess,
    passing_sigterm_on,
    rank_work,
    start_rank,
    stop_ranks,
)
from ipycloud.runtime.train.rank_results import collect_results, stop_grace

if TYPE_CHECKING:
    import torch

__all__ = ["DistributedInfo", "LaunchError", "RemoteTraceback", "check_group_started",
           "distributed_info", "is_main_process", "launch", "run_under_torchrun",
           "wrap_for_distributed"]

T = TypeVar("T")
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_EXIT_GRACE_S = 10.0  # time a worker that has reported gets to exit by itself


@dataclass(frozen=True)
class DistributedInfo:
    """This process's place in an initialised torch.distributed process group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str


def launch(fn: Callable[..., T], *args: Any, nprocs: int | str = "auto",
           backend: str = "auto", **kwargs: Any) -> list[T]:
    """Run ``fn(*args, **kwargs)`` in ``nprocs`` processes under torch.distributed.

    Returns the ranks' return values in rank order; they must be picklable and must not
    hold CUDA tensors (unpickling one would initialise CUDA here: return ``.cpu()`` copies).

    ``nprocs="auto"`` is the number of visible NVIDIA GPUs (found through NVML, which does
    not initialise CUDA), or, without GPUs, ``min(2, usable CPU cores)`` CPU processes.
    ``backend="auto"`` is "nccl" on GPUs and "gloo" otherwise. When every rank can have a
    GPU of its own, rank r calls ``torch.cuda.set_device(r)``. Each rank uses
    ``usable cores // nprocs`` torch threads (at least 1).

    If a rank raises or dies, the other ranks are terminated at once (after a rank ended
    by SIGTERM, once they end or 30 s have passed: the first may be saving), and
    LaunchError names the rank and the error; the rank's traceback is chained as a
    RemoteTraceback. A SIGTERM
    to this process (the machine going away) is passed on to every rank, so ``fit`` saves
    in the first; once the ranks have ended, the signal takes its course here too.

    The ranks are forked from this process, unless CUDA is already initialised here (a
    forked rank could not use it): then they start fresh, which takes longer (each imports
    torch), and ``fn`` and its arguments are pickled by value with cloudpickle; where they
    cannot be, LaunchError names the cell that first initialised CUDA.
    """
    require("torch", "torch")
    count, chosen = check_launch_arguments(nprocs, backend)
    start = rank_start()
    work = rank_work(start, fn, args, kwargs)
    plan = plan_launch(count, chosen)
    workers: list[RankProcess] = []
    with passing_sigterm_on(workers):
        try:
            for rank in range(plan.nprocs):
                workers.append(start_rank(start, rank, plan, work))
            results = collect_results(workers, plan.nprocs)
        except LaunchError as error:
            stop_ranks(workers, grace=stop_grace(error))
            raise
        except BaseException:
            stop_ranks(workers, grace=0.0)
            raise
        stop_ranks(workers, grace=_EXIT_GRACE_S)
    return results


def distributed_info() -> DistributedInfo | None:
    """Rank, world size, local rank and backend, or None without an initialised group.

    The local rank is LOCAL_RANK (set by launch and torchrun), else the global rank.
    """
    if "torch" not in sys.modules:  # without torch imported no process group can exist
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    rank = dist.get_rank()
    return DistributedInfo(rank=rank, world_size=dist.get_world_size(),
                           local_rank=int(os.environ.get("LOCAL_RANK", rank)),
                           backend=str(dist.get_backend()))


def check_group_started() -> None:
    """LaunchError in a process that torchrun started as one of several ranks, while no
    process group is initialised: each rank would train alone and save to one folder."""
    world = os.environ.get("WORLD_SIZE", "1")
    if "RANK" in os.environ and world.isdigit() and int(world) > 1 \
            and distributed_info() is None:
        raise LaunchError(f"this process is rank {os.environ['RANK']} of {world} started by "
                          "torchrun, and no process group is initialised: call fit inside "
                          "ipycloud.run_under_torchrun(train) (or after "
                          "torch.distributed.init_process_group())")


def is_main_process() -> bool:
    """True when not distributed, or on rank 0: the process that logs and saves."""
    info = distributed_info()
    return info is None or info.rank == 0


def wrap_for_distributed(model: torch.nn.Module,
                         device: torch.device | str) -> torch.nn.Module:
    """``model`` wrapped in DistributedDataParallel when the world has more than one rank.

    The model must already be on ``device``. On CUDA, DDP gets ``device_ids=[index]``; on
    other devices none. Without a process group, or with one rank, the model is returned
    unchanged, as is a model that is already wrapped.
    """
    info = distributed_info()
    if info is None or info.world_size == 1:
        return model
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model
    device = torch.device(device)
    if device.type != "cuda":
        return DistributedDataParallel(model)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DistributedDataParallel(model, device_ids=[index])


def run_under_torchrun(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in a process started by torchrun, and return its result.

    Initialises the process group from torchrun's environment (NCCL on NVIDIA GPUs with
    ``torch.cuda.set_device(LOCAL_RANK)``, gloo otherwise) unless one is already
    initialised, and destroys the group it created when ``fn`` ends, once every rank has
    returned. Start the script with ``ipycloud torchrun`` (torchrun whose restarts never
    hang); a rank warns when its torchrun could hang.
    """
    missing = [name for name in _TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise LaunchError(f"not started by torchrun ({', '.join(missing)} unset): run "
                          "python -m torch.distributed.run --nproc_per_node=N script.py")
    import torch
    import torch.distributed as dist

    from ipycloud.runtime.train.elastic import warn_if_restarts_can_hang

    warn_if_restarts_can_hang()
    backend = auto_backend(len(usable_gpus()))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend)
    try:
        result = fn(*args, **kwargs)
        if owns_group:
            # No rank leaves while another still works (the first rank's final save): a
            # peer's closed connections would fail that rank, and its agent would restart
            # a group whose other ranks have ended.
            dist.barrier()
        return result
    finally:
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()
