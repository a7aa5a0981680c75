"""Interrupting ``fit`` is a pause: the first Ctrl-C (or the notebook's Stop button) is
noted and acted on between optimizer steps; a second one interrupts at once."""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from ipycloud.runtime.lifetime import end_with


class DeferredInterrupt:
    """While active in the main thread, SIGINT sets ``requested`` instead of raising.

    The second SIGINT puts the previous handler back and raises KeyboardInterrupt there
    and then, for a step that never ends. Elsewhere (another thread) it does nothing.
    """

    def __init__(self, notice: str) -> None:
        self.notice = notice
        self.requested = False
        self._previous: Any = None
        self._active = False

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._note)
            self._active = True
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._active:
            signal.signal(signal.SIGINT, self._previous)
            self._active = False

    def _note(self, number: int, frame: FrameType | None) -> None:
        if self.requested:
            self.__exit__(None, None, None)
            raise KeyboardInterrupt
        self.requested = True
        print(self.notice, flush=True)


class WorkerInit:
    """A DataLoader ``worker_init_fn`` that lets workers outlive an interrupt of the kernel,
    and makes them end with the process that trains.

    Jupyter interrupts the kernel's whole process group; a worker that died of it would
    fail the step ``fit`` finishes before pausing. The loader stops its workers itself.
    torch's workers watch the parent they find once started, so one whose trainer dies as
    it starts watches its new parent and never ends: given ``trainer`` (the PID of the
    process that trains, when it is the workers' parent), they end as soon as it does.
    Wraps the loader's own ``worker_init_fn`` (picklable, for workers started by spawn).
    """

    def __init__(self, inner: Any, trainer: int | None = None) -> None:
        self.inner = inner
        self.trainer = trainer

    def __call__(self, worker_id: int) -> None:
        if self.trainer is not None:
            end_with(self.trainer)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.inner is not None:
            self.inner(worker_id)
