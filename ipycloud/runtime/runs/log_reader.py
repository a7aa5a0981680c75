"""One run's log read as it grows, in bounded memory and time, whoever wrote it.

Each ``read`` takes only the bytes appended since the last (up to the size the file had
when the read began, so a fast writer never keeps it reading) and adds their records to a
``RunState``, which holds what the summary and the curves need, not the records. A log
replaced (another inode), cut (shorter than what was read) or written again (its first
bytes, or those before where the last read ended, changed: cut and regrown past the
offset) is read afresh. The log is opened with ``untrusted.open_regular``: never through a
symlink, never waiting on a FIFO. Each damaged line is told once (see ``records.Lines``),
however often the log is read. A read may take at most a ``budget`` of bytes, leaving the
rest to the next. The records themselves, for the fronts that serve them
(``records_after``), are the last RECENT_RECORDS as read, and older ones read again from
the log, from a place noted every MARK_EVERY records: a client pages through a log of any
length, RECORDS_LIMIT records an answer, without it being read from its start. A read
shows them chunk by chunk: ``records_after`` never waits for a whole read (a huge log's
reads take a second each) to end. A reader in the background of a busy process (a
server's, a kernel's) reads in small chunks with a pause after each
(``read(background=True)``): parsing holds Python's interpreter lock, and a long read
would otherwise keep the process's other threads waiting for it (a request's answer
delayed by tens of milliseconds at each of its hand-overs between threads).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.summary import RunState, RunSummary
from ipycloud.runtime.untrusted import open_regular

Json = dict[str, Any]
HEAD_BYTES = 4096  # of the log's start, compared on each read to tell a rewritten log
END_BYTES = 256  # and of what was read before the last read's end
MAX_APPENDED = 10_000  # records one read returns at most (the newest); more renew
RECORDS_LIMIT = 10_000  # records ``records_after`` gives at most: the first ones after since
RECENT_RECORDS = 2000  # the last records read, kept as they are for ``records_after``
MARK_EVERY = 10_000  # records between two places of the log noted to read it again from
BACKGROUND_CHUNK_BYTES = 8 << 10  # read at a time in the background: ~1 ms of parsing
BACKGROUND_PAUSE_S = 0.001  # after each such chunk, for the process's other threads


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
        self._lock = threading.Lock()  # one read at a time; the state
        self._shown = threading.Lock()  # what ``records_after`` reads (the last group)
        self._begin(None)

    def _begin(self, identity: tuple[int, int] | None) -> None:
        self.state = RunState()
        self.offset = 0  # bytes taken
        self._identity = identity  # the file's device and inode
        self._head = b""  # the log's first bytes, up to HEAD_BYTES
        self._end = b""  # the END_BYTES before ``offset``
        self._lines = records.Lines(self.path)
        self._latest = -math.inf  # the latest time of a record read
        with self._shown:
            self._recent: deque[Json] = deque(maxlen=RECENT_RECORDS)
            self._let_go = -math.inf  # the latest time of the records the recent ones let go
            self._marks: list[tuple[float, int]] = []  # (latest time before, a line's offset)
            self._shown_log = (0, identity)  # where the records shown end, in which file

    def read(self, torn_tail: bool = False, budget: int | None = None,
             background: bool = False) -> Update:
        """Take what was appended (``budget``: at most that many bytes of it, the rest
        left to the next reads); raises the OSError of a log that cannot be read (or is
        not a regular file). ``torn_tail``: tell (once) of a last line without its
        newline, as a reader that lists runs does; a follower leaves it to be completed.
        ``background``: let the process's other threads in (see the module)."""
        with self._lock:
            fd = open_regular(self.path)
            try:
                return self._read(fd, torn_tail, budget, background)
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

    def records_after(self, since: float | None) -> list[Json]:
        """The first RECORDS_LIMIT records of the log whose time is after ``since`` (from
        its first without), as they are on its lines, up to where the last read ended:
        those kept where they hold them all, else read again from the last place noted
        before ``since``. Nothing where the log is another file than the one read; raises
        the OSError of a log that cannot be read."""
        after = -math.inf if since is None else since
        with self._shown:
            if after >= self._let_go:
                return [record for record in self._recent if record["t"] > after][:RECORDS_LIMIT]
            start = max((offset for latest, offset in self._marks
                         if since is not None and latest <= since), default=0)
            stop, identity = self._shown_log
        fd = open_regular(self.path)
        try:
            status = os.fstat(fd)
            if (status.st_dev, status.st_ino) != identity:
                return []
            return _after(fd, records.Lines(self.path, tell=False), start, stop, since)
        finally:
            os.close(fd)

    def _read(self, fd: int, torn_tail: bool, budget: int | None, background: bool) -> Update:
        status = os.fstat(fd)
        identity = (status.st_dev, status.st_ino)
        renewed = not self._same_log(fd, identity, status.st_size)
        if renewed:
            self._begin(identity)
        appended: deque[Json] = deque(maxlen=MAX_APPENDED)
        taken = 0
        stop = status.st_size if budget is None else min(status.st_size, self.offset + budget)
        chunk_bytes = BACKGROUND_CHUNK_BYTES if background else records.CHUNK_BYTES
        while self.offset < stop:
            chunk = os.pread(fd, min(chunk_bytes, stop - self.offset), self.offset)
            if not chunk:
                break
            if self.offset < HEAD_BYTES:
                self._head += chunk[:HEAD_BYTES - self.offset]
            self.offset += len(chunk)
            fresh = self._lines.feed(chunk)
            for record in fresh:
                self.state.add(record)
                appended.append(record)
                self._latest = max(self._latest, record["t"])
            taken += len(fresh)
            self._show(fresh)
            if background and self.offset < stop:
                time.sleep(BACKGROUND_PAUSE_S)
        kept = min(END_BYTES, self.offset)
        self._end = os.pread(fd, kept, self.offset - kept)
        if torn_tail and self.offset == status.st_size:
            self._lines.end()
        return Update(list(appended), renewed or taken > len(appended))

    def _show(self, fresh: list[Json]) -> None:
        """Give ``records_after`` the records of a chunk just read, and note where the
        pending line begins, every MARK_EVERY records: what lies before it is no record
        after the latest time read."""
        pending = self._lines.pending()
        with self._shown:
            for record in fresh:
                if len(self._recent) == RECENT_RECORDS:
                    self._let_go = max(self._let_go, self._recent[0]["t"])
                self._recent.append(record)
            if pending is not None and self.state.count >= (len(self._marks) + 1) * MARK_EVERY:
                self._marks.append((self._latest, self.offset - pending))
            self._shown_log = (self.offset, self._identity)

    def _same_log(self, fd: int, identity: tuple[int, int], size: int) -> bool:
        """Whether the file is the one read so far, grown or not."""
        if identity != self._identity or size < self.offset:
            return False
        return (os.pread(fd, len(self._head), 0) == self._head
                and os.pread(fd, len(self._end), self.offset - len(self._end)) == self._end)


def _after(fd: int, lines: records.Lines, start: int, stop: int,
           since: float | None) -> list[Json]:
    """The first RECORDS_LIMIT records after ``since`` on the whole lines of the log from
    ``start`` to ``stop``."""
    found: list[Json] = []
    offset = start
    while offset < stop and len(found) < RECORDS_LIMIT:
        chunk = os.pread(fd, min(records.CHUNK_BYTES, stop - offset), offset)
        if not chunk:
            break
        offset += len(chunk)
        found += [record for record in lines.feed(chunk) if since is None or record["t"] > since]
    return found[:RECORDS_LIMIT]
