"""The saves a CheckpointManager writes in the background: staging, writing, waiting.

A background save copies the live state into host buffers that are reused from one save
to the next: shared memory for the writer process (``writer_process``) where the state is
in host memory and this system has one, else buffers a thread of this process writes from
(pinned for an accelerator's state). One thread (``background.BackgroundWriter``) carries
the write at idle CPU priority, for IDLE_PRIORITY_S at most (a timer gives it normal
priority then) or until someone waits for it. At most one save is in flight; its failure
is kept and raised by the next wait. Interpreter exit waits for every save in flight, and
reports a failure rather than losing it.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from ipycloud.runtime.checkpoint import writer_process
from ipycloud.runtime.checkpoint.background import (
    IDLE_PRIORITY_S,
    BackgroundWriter,
    background_pays_off,
)
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.checkpoint.data_file import write_data_file
from ipycloud.runtime.checkpoint.errors import CheckpointError, CheckpointStorageError
from ipycloud.runtime.checkpoint.state import HostBuffers
from ipycloud.runtime.checkpoint.writer_process import WriterProcess
from ipycloud.runtime.durable import FileDigest

Blocking = bool | Literal["auto"]
Background = Literal["auto", "process", "thread", "never"]
BACKGROUNDS: tuple[Background, ...] = ("auto", "process", "thread", "never")
PRIORITY_TIMER_NAME = "ipycloud-save-priority"  # the thread that ends a save's idle priority

WriteData = Callable[[Path, Any], FileDigest]  # writes a payload to a data file atomically
Committed = Callable[[CheckpointInfo], None]
# Writes one checkpoint: (payload, what writes its data file, told once it is committed).
WriteCheckpoint = Callable[[dict[str, Any], WriteData, Committed], object]


class BackgroundSaves:
    """The background saves of one manager: where each is staged, what writes it, its
    priority, and its failure, kept for the next ``wait()`` (see the module).

    ``mode`` is the manager's ``background``: "auto", "process", "thread" or "never".
    """

    def __init__(self, mode: Background) -> None:
        if mode not in BACKGROUNDS:
            raise ValueError("background must be 'auto', 'process', 'thread' or 'never', "
                             f"not {mode!r}")
        self.mode = mode
        self.pending: CheckpointInfo | None = None  # until its manifest is written
        self._buffers = HostBuffers()  # for states on an accelerator, written by a thread
        self._process: WriterProcess | None = None  # writes states in host memory
        self._writer = BackgroundWriter("ipycloud-checkpoint-writer")
        weakref.finalize(self, self._writer.close)
        self._failure: BaseException | None = None
        _LIVE_SAVES.add(self)

    def wanted(self, blocking: Blocking, devices: set[str]) -> bool:
        """Whether a save of tensors on ``devices`` with ``blocking`` goes to the
        background: ``blocking=False`` always, "auto" where the mode says so."""
        if isinstance(blocking, bool):
            return not blocking
        if self.mode == "auto":
            return background_pays_off(devices)
        return self.mode != "never"

    def start(self, pending: CheckpointInfo, payload: dict[str, Any], in_host_memory: bool,
              write: WriteCheckpoint) -> None:
        """Stage ``payload`` (its live state copied now) and have ``write`` write it in the
        background; ``pending`` describes it until its manifest is written. The caller
        waits for the previous save first."""
        staged, write_data = self._stage(payload, in_host_memory)
        self.pending = pending
        # The timer holds this object weakly (one dropped meanwhile closes its writer), and
        # the save's end cancels it (its thread ends then, not seconds later).
        deadline = threading.Timer(IDLE_PRIORITY_S, _hurry_if_alive, (weakref.ref(self),))
        deadline.name, deadline.daemon = PRIORITY_TIMER_NAME, True
        self._writer.submit(lambda: self._write(write, staged, write_data, deadline))
        deadline.start()

    def _stage(self, payload: dict[str, Any],
               in_host_memory: bool) -> tuple[dict[str, Any], WriteData]:
        """Copy the live state in ``payload`` into host buffers; return the payload with
        the copy, and what will write it. (The rest of the payload is made afresh by each
        save.)

        A state in host memory goes to shared memory for the writer process, where this
        system has one, the memory can be had and the mode is not "thread"; any other
        state goes to host buffers (pinned for an accelerator's) for a thread.
        """
        if self.mode != "thread" and writer_process.supported() and in_host_memory:
            if self._process is None or not self._process.owned_here():
                self._process = WriterProcess()  # a forked child starts its own
            with contextlib.suppress(OSError):  # no shared memory: a thread writes it
                staged = self._process.stage(payload["state"])
                return {**payload, "state": staged}, self._process.write
        return {**payload, "state": self._buffers.copy(payload["state"])}, write_data_file

    def _write(self, write: WriteCheckpoint, payload: dict[str, Any], write_data: WriteData,
               deadline: threading.Timer) -> None:
        try:
            write(payload, write_data, self._committed)
        except BaseException as error:  # kept for the next call, never lost
            self._failure = error
        finally:
            deadline.cancel()
            self.pending = None

    def _committed(self, _info: CheckpointInfo) -> None:
        self.pending = None  # listed from its manifest from now on

    def busy(self) -> bool:
        """Whether a save is still being written (``wait()`` would block)."""
        return self._writer.busy()

    def hurry(self) -> None:
        """Give the save in flight normal CPU priority (its thread and writer process)."""
        if self._process is not None and self._process.owned_here():
            self._process.hurry()
        self._writer.hurry()

    def wait(self) -> None:
        """Wait for the save in flight; raise its failure (CheckpointStorageError for a
        folder that failed, CheckpointError otherwise)."""
        self.hurry()
        self._writer.join()
        failure, self._failure = self._failure, None
        if isinstance(failure, CheckpointStorageError):
            raise CheckpointStorageError(f"the previous asynchronous save failed: {failure}",
                                         failure.step) from failure
        if failure is not None:
            raise CheckpointError(f"the previous asynchronous save failed: {failure}") from failure

    def close(self) -> None:
        """Wait for the save in flight (raising its failure), then end the writer process
        and let the thread end. A later save starts new ones."""
        try:
            self.wait()
        finally:
            self._writer.close()
            if self._process is not None and self._process.owned_here():
                self._process.close()
            self._process = None


_LIVE_SAVES: weakref.WeakSet[BackgroundSaves] = weakref.WeakSet()


def _hurry_if_alive(saves: weakref.ref[BackgroundSaves]) -> None:
    """Give a background save normal priority, unless its owner is gone."""
    alive = saves()
    if alive is not None:
        alive.hurry()


@atexit.register
def _wait_for_saves_at_exit() -> None:
    """Interpreter exit waits for background saves; a failure is reported, not lost.

    The writer processes end by themselves once this process is gone.
    """
    reporting_failures(saves.wait for saves in list(_LIVE_SAVES))


def reporting_failures(calls: Iterable[Callable[[], object]]) -> None:
    """Make each call; a CheckpointError is printed to stderr, and the next call made."""
    for call in calls:
        try:
            call()
        except CheckpointError as error:
            print(f"ipycloud: {error}", file=sys.stderr)
