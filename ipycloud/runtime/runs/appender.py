"""Lines appended to a file by a thread of their own, so that storage never holds up training.

``append`` only queues a record (microseconds; safe from a signal handler, and it wakes
no thread); every WRITE_EVERY_S the thread turns what is queued into lines (``encode``:
done there, many at a time, rather than on the training thread between two steps) and
writes them in one ``os.write`` on a descriptor opened with O_APPEND, so a process killed
outright loses at most the lines of its last quarter second, and training shares the
interpreter with the thread only that often. ``write_soon`` wakes the thread for the
lines that matter most (a run's start, a checkpoint); ``flush`` waits for them. Where the file
cannot be written (a Drive mount gone, a full or read-only disk) the lines wait in memory
(beyond MAX_WAITING of them, records marked droppable are dropped), and the thread tries
again every RETRY_S seconds, reopening the file. ``failure`` says what went wrong, for the
caller to tell once.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipycloud.runtime.durable import make_folder, mount_point

WRITE_EVERY_S = 0.25  # between writes of what is queued
MAX_WAITING = 100_000  # lines kept while the file cannot be written
RETRY_S = 5.0  # between tries at a file that fails
CHUNK_LINES = 1024  # lines written in one os.write at most
EXIT_WAIT_S = 2.0  # how long the process's exit waits for the lines still queued

Task = Callable[[], object]  # run on the thread, in order with the lines (errors ignored)


class Appender:
    """Appends lines to ``path`` (its folder made where missing) from a daemon thread."""

    def __init__(self, path: Path, encode: Callable[[Any], bytes],
                 name: str = "ipycloud-run-record") -> None:
        self.path = path
        self._encode = encode  # a record to its line, ending in a newline
        self.failure: OSError | None = None  # the first failure, until a write succeeds
        self.dropped = 0  # records dropped: while the file failed, or that cannot be lines
        # records (each in a 1-tuple), tasks, and None for the end
        self._queue: queue.SimpleQueue[tuple[Any] | Task | None] = queue.SimpleQueue()
        self._queued = 0  # lines and tasks put (counted by the caller's thread)
        self._done = 0  # of them written or run (counted by the writing thread)
        self._waiting: deque[bytes] = deque()  # taken from the queue, not written yet
        self._offset = 0  # bytes of the first waiting line already written
        self._fd: int | None = None
        # of the file's file system, seen now: the thread's first write could come once
        # a mount went away, when the bare folder below it would pass for the folder
        self._mount = mount_point(path.parent)
        self._wake = threading.Event()  # write now
        self._written = threading.Condition()  # notified after each round of writes
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _OPEN.add(self)

    def append(self, record: Any, droppable: bool = False) -> None:
        """Queue ``record`` (not to be changed after: it is encoded later). A
        ``droppable`` one is dropped instead while MAX_WAITING lines wait for a failing
        file."""
        if droppable and self._queued - self._done >= MAX_WAITING:
            self.dropped += 1
            return
        self._queued += 1
        self._queue.put((record,))

    def call(self, task: Task) -> None:
        """Run ``task`` on the thread after the lines queued so far are written or kept."""
        self._queued += 1
        self._queue.put(task)

    def write_soon(self) -> None:
        """Have the thread write what is queued now, not at its next round (waits for
        nothing): for the lines a process killed outright must not lose."""
        self._wake.set()

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for what is queued to be written; whether it is.
        Returns at once while the file fails."""
        wanted = self._queued
        with self._written:
            self._wake.set()
            self._written.wait_for(lambda: self._done >= wanted or self.failure is not None,
                                   timeout)
        return self._done >= wanted

    def close(self) -> None:
        """Stop once the lines queued are written (the thread goes on trying while the
        file fails, until the process exits)."""
        self._queue.put(None)
        self._wake.set()
        _OPEN.discard(self)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        closing = False
        while not (closing and not self._waiting):
            self._wake.wait(WRITE_EVERY_S if self.failure is None else RETRY_S)
            self._wake.clear()
            closing = self._take() or closing
            self._write()
            with self._written:
                self._written.notify_all()
        self._close_file()

    def _take(self) -> bool:
        """Move the queued lines to the waiting ones, running the tasks in their turn;
        whether ``close`` was asked."""
        closing = False
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return closing
            if item is None:
                closing = True
            elif isinstance(item, tuple):
                self._take_record(item[0])
            else:
                self._write()
                with contextlib.suppress(Exception):
                    item()
                self._done += 1

    def _take_record(self, record: Any) -> None:
        try:
            self._waiting.append(self._encode(record))
        except Exception:  # a record that cannot be a line (a value that refers to itself)
            self.dropped += 1
            self._done += 1

    def _write(self) -> None:
        """Write the waiting lines; on failure keep them, and note it."""
        while self._waiting:
            lines = itertools.islice(self._waiting, CHUNK_LINES)
            data = b"".join(lines)[self._offset:]
            try:
                written = os.write(self._open(), data)
            except OSError as error:
                self._failed(error)
                return
            self.failure = None
            self._advance(written)

    def _advance(self, written: int) -> None:
        """Drop the lines ``written`` bytes completed."""
        self._offset += written
        while self._waiting and self._offset >= len(self._waiting[0]):
            self._offset -= len(self._waiting.popleft())
            self._done += 1

    def _open(self) -> int:
        if self._fd is None:
            if self._mount is None:
                self._mount = mount_point(self.path.parent)
            make_folder(self.path.parent, self._mount)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                               0o644)
            if self._offset:  # a line cut short before the failure: begin afresh below it
                self._waiting[0] = b"\n" + self._waiting[0]
                self._offset = 0
        return self._fd

    def _failed(self, error: OSError) -> None:
        if self.failure is None:
            self.failure = error
        self._close_file()

    def _close_file(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None



_OPEN: weakref.WeakSet[Appender] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """At the process's exit, give the lines still queued a moment to be written."""
    for appender in list(_OPEN):
        appender.flush(EXIT_WAIT_S)


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) has none of the threads: it closes their
    descriptors and writes nothing."""
    global _OPEN
    for appender in list(_OPEN):
        if appender._fd is not None:
            with contextlib.suppress(OSError):
                os.close(appender._fd)
    _OPEN = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
