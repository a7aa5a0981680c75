"""One run's log read as it grows, in bounded memory and time, whoever wrote it.

Each ``read`` takes only the bytes appended since the last (up to the size the file had
when the read began, so a fast writer never keeps it reading) and adds their records to a
``RunState``, which holds what the summary and the curves need, not the records. A log
replaced (another inode), cut (shorter than what was read) or written again from its
start (its first bytes changed: cut and regrown past the offset) is read afresh. The log
is opened with ``untrusted.open_regular``: never through a symlink, never waiting on a
FIFO. Each damaged line is told once (see ``records.Lines``), however often the log is
read.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.summary import RunState, RunSummary
from ipycloud.runtime.untrusted import open_regular

Json = dict[str, Any]
HEAD_BYTES = 4096  # of the log's start, compared on each read to tell a rewritten log
MAX_APPENDED = 10_000  # records one read returns at most (the newest); more renew


@dataclass(frozen=True)
class Update:
    """What one read found: the records ``appended`` since the last read (the newest
    MAX_APPENDED of them), and whether the state was ``renewed``: read afresh (the first
    read, a log replaced, cut or rewritten) or more records came than ``appended`` holds,
    so that a view built from the records it was given must be built again from the
    state."""

    appended: list[Json] = field(default_factory=list)
    renewed: bool = False


class LogReader:
    """The log at ``path``, read incrementally into ``state`` (see the module's docstring).
    Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._begin(None)

    def _begin(self, identity: tuple[int, int] | None) -> None:
        self.state = RunState()
        self.offset = 0  # bytes taken
        self._identity = identity  # the file's device and inode
        self._head = b""  # the log's first bytes, up to HEAD_BYTES
        self._lines = records.Lines(self.path)

    def read(self, torn_tail: bool = False) -> Update:
        """Take what was appended; raises the OSError of a log that cannot be read (or
        is not a regular file). ``torn_tail``: tell (once) of a last line without its
        newline, as a reader that lists runs does; a follower leaves it to be completed."""
        with self._lock:
            fd = open_regular(self.path)
            try:
                return self._read(fd, torn_tail)
            finally:
                os.close(fd)

    def summary(self, now: float | None = None) -> RunSummary:
        """The run's summary as read so far (``now``: the time to judge a live run by)."""
        with self._lock:
            return self.state.summary(self.path, now)

    def records(self) -> list[Json]:
        """The records the state keeps, in time order (see ``RunState.records``)."""
        with self._lock:
            return self.state.records()

    def _read(self, fd: int, torn_tail: bool) -> Update:
        status = os.fstat(fd)
        identity = (status.st_dev, status.st_ino)
        renewed = not self._same_log(fd, identity, status.st_size)
        if renewed:
            self._begin(identity)
        appended: deque[Json] = deque(maxlen=MAX_APPENDED)
        taken = 0
        while self.offset < status.st_size:
            chunk = os.pread(fd, min(records.CHUNK_BYTES, status.st_size - self.offset),
                             self.offset)
            if not chunk:
                break
            if self.offset < HEAD_BYTES:
                self._head += chunk[:HEAD_BYTES - self.offset]
            self.offset += len(chunk)
            for record in self._lines.feed(chunk):
                self.state.add(record)
                appended.append(record)
                taken += 1
        if torn_tail:
            self._lines.end()
        return Update(list(appended), renewed or taken > len(appended))

    def _same_log(self, fd: int, identity: tuple[int, int], size: int) -> bool:
        """Whether the file is the one read so far, grown or not."""
        if identity != self._identity or size < self.offset:
            return False
        return not self._head or os.pread(fd, len(self._head), 0) == self._head
