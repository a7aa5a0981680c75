"""Run a training function in several processes under torch.distributed, from a notebook.

``launch(train, nprocs=2)`` forks ``nprocs`` workers from the kernel, initialises a process
group in each (rank, world size, a free port on 127.0.0.1) and runs ``train`` there; the
return values come back to the notebook, one per rank. Each worker gets the environment
``torchrun`` gives (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), so code written for torchrun runs unchanged. Workers are forked, not spawned,
because a function defined in a notebook lives in ``__main__``, which a spawned process
cannot import; fork is why CUDA must not be initialised in the kernel before the launch.

Several machines, or a script: the same function runs under ``torchrun``. Put it in a
script that ends with::

    if __name__ == "__main__":
        run_under_torchrun(train, ...)

and start the script on every node, e.g.
``torchrun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --nproc_per_node=8 train.py``.
``run_under_torchrun`` initialises the process group from torchrun's environment (NCCL on
NVIDIA GPUs, gloo otherwise), runs the function and destroys the group;
``distributed_info()`` (and ``fit``) find the group there as they do under ``launch``.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing import connection
from typing import TYPE_CHECKING, Any, TypeVar

from ipycloud.runtime._optional import require
from ipycloud.runtime.lifetime import end_with
from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.train.device import usable_gpus
from ipycloud.runtime.train.interrupt import deliver_sigterm
from ipycloud.runtime.units import counted

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkContext
    from multiprocessing.process import BaseProcess

    import torch

T = TypeVar("T")

BACKENDS = ("gloo", "nccl")
MASTER_ADDR = "127.0.0.1"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_POLL_S = 0.5  # the longest the notebook sleeps before looking at its workers again
_EXIT_GRACE_S = 10.0  # time a worker that has reported gets to exit by itself
_KILL_GRACE_S = 3.0  # time a terminated worker gets before SIGKILL, and after it
_SETTLE_S = 1.0  # how long a reported failure waits for silent ranks to show they died
_SAVE_GRACE_S = 30.0  # time the others get after a rank ended by SIGTERM (the first saves)
_CUDA_INITIALISED = (
    "CUDA is already initialised in this kernel, so forked workers cannot use it: restart "
    "the kernel and call launch() before anything touches CUDA (typically .cuda(), "
    ".to('cuda'), torch.cuda.current_device() or a CUDA tensor), or run a script with "
    "torchrun and run_under_torchrun()"
)


class LaunchError(RuntimeError):
    """A launch was refused, or a rank failed; ``rank`` and ``exitcode`` say which and how."""

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None,
                 remote_traceback: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback


class RemoteTraceback(Exception):
    """A worker's formatted traceback, chained as the cause of its LaunchError."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


@dataclass(frozen=True)
class DistributedInfo:
    """This process's place in an initialised torch.distributed process group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str


@dataclass(frozen=True)
class _Plan:
    """What every worker of one launch is told."""

    nprocs: int
    backend: str
    use_cuda: bool  # one GPU per rank: rank r uses cuda:r
    port: int
    threads: int  # torch intra-op threads per rank
    launcher: int  # the PID of the process that launches: every rank ends with it


@dataclass(frozen=True)
class _Worker:
    rank: int
    process: BaseProcess
    reader: Connection


@dataclass(frozen=True)
class _Failure:
    """Why one rank failed; ``reported`` is False when it died without saying."""

    rank: int
    summary: str
    reported: bool
    when: float  # time.monotonic() of the failure (reported) or of noticing it (died)
    exitcode: int | None = None
    traceback: str | None = None


def launch(fn: Callable[..., T], *args: Any, nprocs: int | str = "auto",
           backend: str = "auto", **kwargs: Any) -> list[T]:
    """Run ``fn(*args, **kwargs)`` in ``nprocs`` forked processes under torch.distributed.

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
    in the first; once the ranks have ended, the signal takes its course here too. CUDA
    must not be initialised in this process beforehand (LaunchError says so); note that
    ``torch.cuda.is_available()`` initialises the CUDA driver unless
    PYTORCH_NVML_BASED_CUDA_CHECK=1 is set, and a forked rank then fails to use its GPU.
    """
    require("torch", "torch")
    count, chosen = _check_arguments(nprocs, backend)
    _refuse_after_cuda_init()
    context = _fork_context()
    plan = _plan(count, chosen)
    workers: list[_Worker] = []
    with _passing_sigterm_on(workers):
        try:
            for rank in range(plan.nprocs):
                workers.append(_start(context, rank, plan, fn, args, kwargs))
            results = _collect(workers, plan.nprocs)
        except LaunchError as error:
            _stop(workers, grace=_stop_grace(error))
            raise
        except BaseException:
            _stop(workers, grace=0.0)
            raise
        _stop(workers, grace=_EXIT_GRACE_S)
    return results


@contextlib.contextmanager
def _passing_sigterm_on(workers: list[_Worker]) -> Iterator[None]:
    """While the ranks run: a SIGTERM here is sent on to each of them, then delivered to
    this process's previous handler once they have ended. Nothing where SIGTERM is
    ignored, or outside the main thread."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN):
        yield
        return
    received: list[int] = []

    def pass_on(number: int, frame: Any) -> None:
        received.append(number)
        for worker in workers:
            if worker.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, pass_on)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            deliver_sigterm(previous)


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
    backend = _auto_backend(len(usable_gpus()))
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


# -- checks and planning (in the notebook process) ------------------------------------------


def _check_arguments(nprocs: int | str, backend: str) -> tuple[int | None, str]:
    """Validate the arguments before anything is probed: (nprocs or None for auto, backend)."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}, "
                         f"got {backend!r}")
    if nprocs == "auto":
        return None, backend
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int or 'auto', got {nprocs!r}")
    return nprocs, backend


def _refuse_after_cuda_init() -> None:
    """LaunchError when torch has initialised CUDA here: forked workers could not use it."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        raise LaunchError(_CUDA_INITIALISED)


def _fork_context() -> ForkContext:
    if "fork" not in multiprocessing.get_all_start_methods():
        raise LaunchError("launch() forks its workers and this platform cannot fork: run a "
                          "script with torchrun and run_under_torchrun() instead")
    return multiprocessing.get_context("fork")


def _plan(nprocs: int | None, backend: str) -> _Plan:
    gpus, cpus = len(usable_gpus()), _usable_cpus()
    count = nprocs if nprocs is not None else (gpus or min(2, cpus))
    chosen = _auto_backend(gpus) if backend == "auto" else backend
    if chosen == "nccl":
        _check_nccl(count, gpus)
    return _Plan(nprocs=count, backend=chosen, use_cuda=0 < count <= gpus,
                 port=_free_port(), threads=max(1, cpus // count), launcher=os.getpid())


def _auto_backend(gpus: int) -> str:
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


# -- the workers ----------------------------------------------------------------------------


def _start(context: ForkContext, rank: int, plan: _Plan, fn: Callable[..., Any],
           args: Sequence[Any], kwargs: dict[str, Any]) -> _Worker:
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_worker_main, name=f"ipycloud-rank-{rank}",
                              args=(rank, plan, fn, args, kwargs, writer))
    process.start()
    writer.close()  # the worker holds the only write end now
    return _Worker(rank, process, reader)


def _worker_main(rank: int, plan: _Plan, fn: Callable[..., Any], args: Sequence[Any],
                 kwargs: dict[str, Any], writer: Connection) -> None:
    """One forked rank: set torch up, run ``fn``, report the outcome, destroy the group.

    The report is sent before the group is destroyed, so a failing rank's own error reaches
    the notebook before its peers fail on the connections it closes.
    """
    try:
        _init_worker(rank, plan)
        payload = _result_payload(fn(*args, **kwargs))
    except BaseException as error:  # report everything, KeyboardInterrupt included
        payload = _error_payload(error)
    try:
        writer.send_bytes(payload)
    finally:
        writer.close()
        _destroy_group()


def _init_worker(rank: int, plan: _Plan) -> None:
    import torch

    end_with(plan.launcher)  # a kernel killed mid-launch takes its ranks with it
    # OpenMP thread pools do not survive fork: size torch's pool before anything uses it.
    torch.set_num_threads(plan.threads)
    _reset_inherited_signals()
    os.environ.update(_torchrun_environment(rank, plan))
    if plan.use_cuda:
        torch.cuda.set_device(rank)
    import torch.distributed as dist

    dist.init_process_group(plan.backend, rank=rank, world_size=plan.nprocs)


def _reset_inherited_signals() -> None:
    """Drop the kernel's handlers (keepalive's SIGTERM, the event loop's wakeup fd)."""
    with contextlib.suppress(ValueError):  # only possible in the main thread
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _torchrun_environment(rank: int, plan: _Plan) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(plan.nprocs), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(plan.nprocs), "MASTER_ADDR": MASTER_ADDR,
            "MASTER_PORT": str(plan.port)}


def _destroy_group() -> None:
    with contextlib.suppress(Exception):  # the outcome has been reported already
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


class _ResultPickler(pickle.Pickler):
    """Pickles a return value, refusing CUDA tensors: unpickling one initialises CUDA."""

    def __init__(self, file: io.BytesIO, tensor_type: type[torch.Tensor]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensor_type = tensor_type

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, self.tensor_type) and obj.device.type == "cuda":
            raise TypeError("fn returned a CUDA tensor, which would initialise CUDA in the "
                            "notebook: return .cpu() copies")
        return NotImplemented


def _result_payload(value: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    try:
        _ResultPickler(buffer, torch.Tensor).dump(("ok", value))
    except Exception as error:
        raise TypeError(f"the return value of fn cannot be sent to the notebook: "
                        f"{describe_error(error)}") from error
    return buffer.getvalue()


def _error_payload(error: BaseException) -> bytes:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return pickle.dumps(("error", describe_error(error), text, time.monotonic()))


# -- collecting and stopping (in the notebook process) --------------------------------------


def _collect(workers: list[_Worker], nprocs: int) -> list[Any]:
    """Every rank's return value, or LaunchError for the rank that failed first."""
    results: dict[int, Any] = {}
    while len(results) < nprocs:
        pending = [worker for worker in workers if worker.rank not in results]
        _wait_for_any(pending, _POLL_S)
        failures = _gather(pending, results)
        if failures:
            if all(failure.reported for failure in failures):
                done = results.keys() | {failure.rank for failure in failures}
                failures += _late_deaths([w for w in pending if w.rank not in done])
            failure = _root_cause(failures)
            remote = RemoteTraceback(failure.traceback) if failure.traceback else None
            raise _launch_error(failure, nprocs) from remote
    return [results[rank] for rank in range(nprocs)]


def _wait_for_any(workers: list[_Worker], timeout: float) -> None:
    """Sleep until a worker reports or exits, or ``timeout`` seconds pass."""
    connection.wait([worker.reader for worker in workers]
                    + [worker.process.sentinel for worker in workers], timeout=timeout)


def _gather(workers: list[_Worker], results: dict[int, Any]) -> list[_Failure]:
    """Store the values of ranks that returned; the failures of the ranks that failed."""
    failures: list[_Failure] = []
    for worker in workers:
        outcome = _outcome(worker)
        if isinstance(outcome, _Failure):
            failures.append(outcome)
        elif outcome is not None:
            results[worker.rank] = outcome[0]
    return failures


def _late_deaths(workers: list[_Worker]) -> list[_Failure]:
    """The failures of still-silent ranks that show within _SETTLE_S seconds.

    A rank killed mid-collective closes its sockets while it exits; a peer can fail on them
    and report before the exit is visible here, so a reported error is not blamed until the
    silent ranks have had a moment to show that they died.
    """
    deadline = time.monotonic() + _SETTLE_S
    failures: list[_Failure] = []
    results: dict[int, Any] = {}
    while workers and time.monotonic() < deadline:
        _wait_for_any(workers, deadline - time.monotonic())
        failures += _gather(workers, results)
        done = results.keys() | {failure.rank for failure in failures}
        workers = [worker for worker in workers if worker.rank not in done]
    return failures


def _outcome(worker: _Worker) -> tuple[Any] | _Failure | None:
    """(value,) when the rank returned, a _Failure, or None while it is still running."""
    if worker.reader.poll():
        try:
            message = pickle.loads(worker.reader.recv_bytes())
        except EOFError:  # it closed its end without reporting: it is exiting
            return _death(worker)
        except Exception as error:
            summary = f"its return value cannot be unpickled: {describe_error(error)}"
            return _Failure(worker.rank, summary, True, time.monotonic())
        if message[0] == "ok":
            return (message[1],)
        _, summary, text, when = message
        return _Failure(worker.rank, summary, True, when, traceback=text)
    # The sentinel is ready as soon as the process starts to exit, while its sockets close:
    # before a peer can fail on them and report it, which waitpid (is_alive) is not.
    if connection.wait([worker.process.sentinel], timeout=0):
        return _death(worker)
    return None


def _death(worker: _Worker) -> _Failure:
    worker.process.join(_KILL_GRACE_S)  # reap it for its exit status
    code = worker.process.exitcode
    if code is None:
        how = "closed its result pipe and is still running"
    elif code < 0:
        how = f"killed by signal {_signal_name(-code)}"
    else:
        how = f"exited with code {code}"
    return _Failure(worker.rank, f"died without reporting: {how}", False, time.monotonic(),
                    exitcode=code)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _root_cause(failures: list[_Failure]) -> _Failure:
    """The failure that most likely caused the others seen with it.

    A rank that died unreported is blamed first (its peers then fail on closed
    connections), then the earliest reported error.
    """
    return min(failures, key=lambda failure: (failure.reported, failure.when))


def _stop_grace(error: LaunchError) -> float:
    """Seconds the other ranks get to end by themselves after ``error``: a rank ended by
    SIGTERM stops with its group at one step, which the first rank may still be saving,
    so the others get the time a spot VM gives between SIGTERM and SIGKILL; none after
    any other failure."""
    return _SAVE_GRACE_S if error.exitcode == -signal.SIGTERM else 0.0


def _launch_error(failure: _Failure, nprocs: int) -> LaunchError:
    verb = "failed: " if failure.reported else ""
    return LaunchError(f"rank {failure.rank} of {nprocs} {verb}{failure.summary}",
                       rank=failure.rank, exitcode=failure.exitcode,
                       remote_traceback=failure.traceback)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C is held meanwhile and raised after (where this is the main thread): a second
    press while the ranks are being stopped (a bounded wait) must not leave them running,
    unreaped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: pressed.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pressed and callable(previous):
            previous(signal.SIGINT, None)


def _stop(workers: list[_Worker], grace: float) -> None:
    """Let workers exit within ``grace`` seconds, then terminate, then kill; bounded waits,
    which Ctrl-C does not cut short."""
    with _interrupts_held():
        _end(workers, grace)


def _end(workers: list[_Worker], grace: float) -> None:
    deadline = time.monotonic() + grace
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.process.is_alive():
            worker.process.terminate()
    for worker in workers:
        worker.process.join(_KILL_GRACE_S)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(_KILL_GRACE_S)
        worker.reader.close()
