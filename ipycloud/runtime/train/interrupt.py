"""Interrupting ``fit`` is a pause: the first Ctrl-C (or the notebook's Stop button) is
noted and acted on between optimizer steps; a second one interrupts at once. SIGTERM (the
machine going away: preemption, the end of a session) is a save, then the end."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from ipycloud.runtime.lifetime import end_on_sigterm_from, end_with


class FitInterrupted(KeyboardInterrupt):
    """``fit`` paused on an interrupt, saved where it stands (with a checkpoint folder) and
    printed the one line that says so, which is also the message; a notebook front ends
    the cell with that line alone, without a traceback."""


class GroupStopped(RuntimeError):
    """Another rank of the process group got SIGTERM: the group saved and stopped at one
    step, and this rank ends with an error, so that torchrun restarts the group (on the
    machines that stay) from that step."""


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


class Preemption:
    """While active in the main thread, SIGTERM asks ``fit`` to save where it stands and
    then lets the signal take its course.

    On SIGTERM, ``save_now()`` is called at once from the handler: it saves and returns
    True where the live state is that of the last finished step (between epochs, during
    validation), or returns False, and the loop saves at the next step boundary, where
    it checks ``requested`` and calls ``end()``. ``end()`` puts the previous handler back
    and delivers the signal to it: the default ends the process, a Python handler (the
    session guard's) runs. A SIGTERM ignored before ``fit`` stays ignored. In a rank
    other than the first of a process group (``main=False``) the signal is only noted:
    the ranks agree at a step boundary to stop together, and the first rank saves.
    """

    def __init__(self, save_now: Callable[[], bool], main: bool = True) -> None:
        self.requested = False
        self._save_now = save_now
        self._main = main
        self._previous: Any = None
        self._active = False
        self._pid = os.getpid()  # the process whose fit this is

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            if previous != signal.SIG_IGN:
                self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
                self._active = True
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._active:
            signal.signal(signal.SIGTERM, self._previous)
            self._active = False

    def end(self) -> None:
        """Put the previous handler back and deliver SIGTERM to it (returns only where
        that handler does: a Python one that lets the process live)."""
        previous = self._previous
        self.__exit__(None, None, None)
        deliver_sigterm(previous)

    def _on_sigterm(self, number: int, frame: FrameType | None) -> None:
        # A process forked from this one (a DataLoader worker before its worker_init_fn
        # sets SIGTERM aside) inherits this handler: it must never save.
        if self.requested or os.getpid() != self._pid:
            return
        self.requested = True
        if self._main and self._save_now():
            self.end()


def deliver_sigterm(handler: Any) -> None:
    """Deliver SIGTERM to ``handler``, a handler just put back: call it if it is Python's,
    else raise the signal (the default ends the process)."""
    if callable(handler):
        handler(signal.SIGTERM, None)
    else:
        signal.raise_signal(signal.SIGTERM)


class WorkerInit:
    """A DataLoader ``worker_init_fn`` that lets workers outlive an interrupt of the kernel
    and the SIGTERM of a machine going away, and makes them end with the process that
    trains.

    Jupyter interrupts the kernel's whole process group, and a machine going away sends
    SIGTERM to every process; a worker that died of either would fail the step ``fit``
    finishes before saving. A SIGTERM from ``trainer`` (the PID of the process that trains)
    still ends a worker: multiprocessing's exit handler, and torch's shutdown when its
    workers do not end in time, terminate them so. torch's workers watch the parent they
    find once started, so one whose trainer dies as it starts watches its new parent and
    never ends: where ``trainer`` is their parent (started by fork or spawn), they end as
    soon as it does. Wraps the loader's own ``worker_init_fn`` (picklable, for workers
    started by spawn).
    """

    def __init__(self, inner: Any, trainer: int, trainer_is_parent: bool) -> None:
        self.inner = inner
        self.trainer = trainer
        self.trainer_is_parent = trainer_is_parent

    def __call__(self, worker_id: int) -> None:
        end_on_sigterm_from(self.trainer)  # first: no thread may start before
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.trainer_is_parent:
            end_with(self.trainer)
        if self.inner is not None:
            self.inner(worker_id)
