"""The ranks of a launch, forked from the notebook or started fresh: each with the
environment torchrun would give it and a pipe back, through which it reports its return
value or its error before its group is destroyed; stopping them, and passing a SIGTERM on
to them.

A forked rank finds the function and its arguments in the memory it shares with the
notebook. A fresh (spawned) one gets them pickled by value with cloudpickle: a function
defined in a notebook, the classes and values of ``__main__`` it uses, its arguments; what
it imports from modules is imported there by name.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ipycloud.runtime.lifetime import end_with
from ipycloud.runtime.machine.cuda_start import cuda_started_where
from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.train.interrupt import deliver_sigterm
from ipycloud.runtime.train.launch_errors import LaunchError
from ipycloud.runtime.train.launch_plan import CUDA_UP, MASTER_ADDR, LaunchPlan, RankStart

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    import torch

KILL_GRACE_S = 3.0  # time a terminated worker gets before SIGKILL, and after it

# What a rank runs: (fn, args, kwargs) for a forked rank, their cloudpickle for a fresh one.
Work = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | bytes


@dataclass(frozen=True)
class RankProcess:
    """One rank's process, and the read end of the pipe it reports through."""

    rank: int
    process: BaseProcess
    reader: Connection


def rank_work(start: RankStart, fn: Callable[..., Any], args: Sequence[Any],
              kwargs: dict[str, Any]) -> Work:
    """What each rank of ``start`` is given to run; LaunchError, before any rank starts,
    where fresh ranks cannot be sent it."""
    if not start.fresh:
        return fn, tuple(args), dict(kwargs)
    import cloudpickle

    try:
        return bytes(cloudpickle.dumps((fn, tuple(args), dict(kwargs))))
    except Exception as error:
        raise LaunchError(_not_sendable(start, error)) from error


def _not_sendable(start: RankStart, error: Exception) -> str:
    where = cuda_started_where()
    why = f"{start.why}, first after {where}" if where else start.why
    cause = f"launch starts its ranks fresh ({why}), and fn and its arguments cannot be " \
            f"sent to them: {describe_error(error)}: make them picklable (no open file, " \
            "lock, generator or live connection in them or in the globals fn uses)"
    if start.why == CUDA_UP:
        return cause + ", or restart the kernel and call launch() before " + (
            "that cell" if where else "anything touches CUDA")
    return cause


def start_rank(start: RankStart, rank: int, plan: LaunchPlan, work: Work) -> RankProcess:
    """Start rank ``rank`` of ``plan``, which runs ``work`` and reports."""
    reader, writer = start.context.Pipe(duplex=False)
    process = start.context.Process(target=_worker_main, name=f"ipycloud-rank-{rank}",
                                    args=(rank, plan, work, writer))
    process.start()
    writer.close()  # the worker holds the only write end now
    return RankProcess(rank, process, reader)


def _worker_main(rank: int, plan: LaunchPlan, work: Work, writer: Connection) -> None:
    """One rank: set torch up, run the work, report the outcome, destroy the group.

    The report is sent before the group is destroyed, so a failing rank's own error reaches
    the notebook before its peers fail on the connections it closes.
    """
    try:
        _init_worker(rank, plan)
        fn, args, kwargs = pickle.loads(work) if isinstance(work, bytes) else work
        payload = _result_payload(fn(*args, **kwargs))
    except BaseException as error:  # report everything, KeyboardInterrupt included
        payload = _error_payload(error)
    try:
        writer.send_bytes(payload)
    finally:
        writer.close()
        _destroy_group()


def _init_worker(rank: int, plan: LaunchPlan) -> None:
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


def _torchrun_environment(rank: int, plan: LaunchPlan) -> dict[str, str]:
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


@contextlib.contextmanager
def passing_sigterm_on(workers: list[RankProcess]) -> Iterator[None]:
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


def stop_ranks(workers: list[RankProcess], grace: float) -> None:
    """Let workers exit within ``grace`` seconds, then terminate, then kill; bounded waits,
    which Ctrl-C does not cut short."""
    with _interrupts_held():
        _end(workers, grace)


def _end(workers: list[RankProcess], grace: float) -> None:
    deadline = time.monotonic() + grace
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.process.is_alive():
            worker.process.terminate()
    for worker in workers:
        worker.process.join(KILL_GRACE_S)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(KILL_GRACE_S)
        worker.reader.close()
