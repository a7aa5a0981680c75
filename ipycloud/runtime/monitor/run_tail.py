"""Run logs followed by the fronts that look again every second or so (the Jupyter server's
runs routes, the kernel's page), whatever the files hold.

A log is opened only where it is a regular file, never through a link and never blocking
(a FIFO put in its place is refused, not waited on). Each look reads only the bytes
appended since the last one; a log replaced, cut, or cut and written again in place is
read afresh. What is kept of a log is bounded: its last RECENT_RECORDS records, and, of the
older ones, what its summary needs (its starts, last end, last steps, epochs, events and
checkpoints, and counts of those let go).
A line that is not a record (damaged, too deep, a time that is not a finite date) is
skipped, counted in one warning per look.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.summary import LIVE, RunSummary, summarize

logger = logging.getLogger(__name__)

Json = dict[str, Any]

RECENT_RECORDS = 2000  # the last records of a log kept as they are
KEPT_STEPS = 64  # of the older step rows, the last ones (the last loss, the speed)
KEPT_EPOCHS = 10_000  # of the older epochs (the best so far), the last ones
KEPT_NOTES = 1000  # of the older events, and of the checkpoints, the last ones
RECORDS_LIMIT = 10_000  # records one answer gives at most: the first ones after ``since``
MARK_EVERY = 10_000  # records between two places in a log noted, to read it again from
CHUNK = 1 << 20  # bytes read at a time
CHECKED = 256  # bytes at the log's start and before the last look's end, compared again
MAX_T = 253_402_300_799.0  # the last second of the year 9999: later is no date
MAX_INT = 2**63  # a step or epoch as large is no count
INDEX_ENTRY_BYTES = 1 << 16  # an entry of the index longer than this is none
MAX_LINE = 1 << 20  # bytes of a line at most: a longer one is not a record
OVERLONG = b"\0"  # what stands for such a line


class NotARegularFile(OSError):
    """A path that is a FIFO, a device, a folder or a socket: never read."""


def open_regular(path: Path) -> int:
    """A descriptor of the regular file at ``path``, opened without following a link and
    without blocking; NotARegularFile for anything else, OSError where it cannot be."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise NotARegularFile(errno.EINVAL, "not a regular file", str(path))
    return descriptor


def read_regular(path: Path, limit: int) -> bytes:
    """The first ``limit`` bytes of the regular file at ``path`` (see open_regular)."""
    descriptor = open_regular(path)
    try:
        with os.fdopen(descriptor, "rb", closefd=False) as file:
            return file.read(limit)
    finally:
        os.close(descriptor)


def index_entry(path: Path) -> Json | None:
    """An entry of the user's index of runs, read as open_regular reads (a FIFO in the
    index is never waited on); None where it is not one."""
    try:
        entry = json.loads(read_regular(path, INDEX_ENTRY_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("log"), str) else None


def parse_line(line: bytes) -> Json | None:
    """The record on ``line``, or None where it is not one: not JSON (or too deep for the
    parser), not a record, a time that is not a date, a step or epoch out of range."""
    try:
        record = records.parse_record(line)
    except (RecursionError, ValueError, UnicodeDecodeError):
        return None
    if record is None or not _sane(record):
        return None
    return record


def _sane(record: Json) -> bool:
    try:
        when = float(record["t"])
    except OverflowError:
        return False
    counts = [record.get(name) for name in ("step", "epoch")]
    return (math.isfinite(when) and 0.0 <= when <= MAX_T
            and all(-MAX_INT < count < MAX_INT for count in counts if isinstance(count, int)))


@dataclass
class _Folded:
    """What a log's older records (those out of its recent window) give its summary."""

    first_start: Json | None = None
    start: Json | None = None
    end: Json | None = None
    steps: list[Json] = field(default_factory=list)
    epochs: list[Json] = field(default_factory=list)
    notes: dict[str, list[Json]] = field(  # the last events and checkpoints
        default_factory=lambda: {records.EVENT: [], records.CHECKPOINT: []})
    dropped: dict[str, int] = field(  # and how many older ones were let go
        default_factory=lambda: {records.EVENT: 0, records.CHECKPOINT: 0})
    count: int = 0  # records folded in

    def add(self, record: Json) -> None:
        """Fold in ``record``, as a summary counts it: a start drops the steps and epochs
        it redoes, and the end before it."""
        kind = record["kind"]
        self.count += 1
        if kind == records.START:
            self.first_start = self.first_start or record
            self.start, self.end = record, None
            self.steps = [row for row in self.steps if row["step"] <= record["step"]]
            self.epochs = [logs for logs in self.epochs if logs["epoch"] < record["epoch"]]
        elif kind == records.END:
            self.end = record
        elif kind == records.STEP:
            self.steps = [*self.steps[1 - KEPT_STEPS:], record]
        elif kind == records.EPOCH:
            self.epochs = [*self.epochs[1 - KEPT_EPOCHS:], record]
        else:
            kept = [*self.notes[kind], record]
            self.dropped = {**self.dropped, kind: self.dropped[kind] + len(kept[:-KEPT_NOTES])}
            self.notes = {**self.notes, kind: kept[-KEPT_NOTES:]}

    def lines(self) -> list[Json]:
        """The folded records in the log's order (by time: fit writes them in order)."""
        kept = [start for start in (self.first_start, self.start) if start is not None]
        if len(kept) == 2 and kept[0] is kept[1]:
            kept.pop()
        kept += [*self.steps, *self.epochs, *self.notes[records.EVENT],
                 *self.notes[records.CHECKPOINT], *([self.end] if self.end else [])]
        return sorted(kept, key=lambda record: float(record["t"]))


@dataclass(frozen=True)
class _Kept:
    """What a look left of a log; never changed once a look made it, so a reader on another
    thread takes it whole."""

    identity: tuple[int, int] | None = None  # the file's device and inode
    offset: int = 0  # where the last whole line read ends
    checked: bytes = b""  # the log's _fingerprint as the look left it
    recent: tuple[Json, ...] = ()
    folded: _Folded = field(default_factory=_Folded)
    marks: tuple[tuple[float, int], ...] = ()  # (t, offset) of every MARK_EVERY-th record
    records: int = 0  # records read in all


class LogTail:
    """One run log followed as it grows: one thread looks, any may read what it kept."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.summary: Json | None = None  # RunSummary JSON, as of the last look
        self.changed_ns = 0  # the log's modification time at the last look
        self._kept = _Kept()
        self._state: tuple[int, int, int] | None = None  # inode, size, mtime of the look
        self._failure: str | None = None  # why the last summary could not be made

    def look(self) -> bool:
        """Read what was appended since the last look and summarise the run again (a live
        one: its process may have died); whether ``summary`` holds one. False where the log
        cannot be read (gone, no regular file); a log whose records the summary cannot
        take keeps its last summary, with one warning."""
        try:
            self._look()
            self._failure = None
        except OSError:
            return False
        except Exception as error:  # a record no reader foresaw: never the fronts' end
            failure = describe_error(error)
            if failure != self._failure:
                logger.warning("ipycloud could not summarise the run log %s: %s", self.path,
                               failure)
                self._failure = failure
        return self.summary is not None

    def run(self) -> RunSummary:
        """The run as the records kept tell it (all but the events and checkpoints past
        KEPT_NOTES of each)."""
        return _run(self.path, self._kept)

    def records_after(self, since: float | None) -> list[Json]:
        """The first RECORDS_LIMIT records whose time is after ``since`` (all: None), from
        those kept where they hold them all, else read again from the log."""
        kept = self._kept
        oldest = kept.recent[0]["t"] if kept.recent else math.inf
        if not kept.folded.count or (since is not None and since >= oldest):
            return _after(iter(kept.recent), since)
        start = max((offset for when, offset in kept.marks if since is not None and when <= since),
                    default=0)  # the log is in time order: what lies before is not after since
        return _after(self._reread(start, kept.offset), since)

    def _look(self) -> None:
        descriptor = open_regular(self.path)
        try:
            status = os.fstat(descriptor)
            state = (status.st_ino, status.st_size, status.st_mtime_ns)
            if state == self._state and self.summary is not None:
                if self.summary["status"] in LIVE:
                    self.summary = _summarize(self.path, self._kept)
                return
            self._kept = _appended(self.path, descriptor, status, self._kept)
            self._state, self.changed_ns = state, status.st_mtime_ns
        finally:
            os.close(descriptor)
        self.summary = _summarize(self.path, self._kept)

    def _reread(self, start: int, stop: int) -> Iterator[Json]:
        descriptor = open_regular(self.path)
        try:
            for line, _ in _whole_lines(descriptor, start, stop):
                record = parse_line(line) if line.strip() else None
                if record is not None:
                    yield record
        finally:
            os.close(descriptor)


def _appended(path: Path, descriptor: int, status: os.stat_result, kept: _Kept) -> _Kept:
    """``kept`` with the records appended to the log since; read afresh where the log is
    another file, cut, or written again before where the last look ended."""
    identity = (status.st_dev, status.st_ino)
    if (identity != kept.identity or status.st_size < kept.offset
            or _fingerprint(descriptor, kept.offset) != kept.checked):
        kept = _Kept(identity)
    recent, folded, offset = deque(kept.recent), replace(kept.folded), kept.offset
    marks, count = list(kept.marks), kept.records
    skipped = 0
    for line, end in _whole_lines(descriptor, kept.offset, status.st_size):
        begins, offset = offset, end
        record = parse_line(line) if line.strip() else None
        if record is None:
            skipped += bool(line.strip())
            continue
        if len(recent) == RECENT_RECORDS:
            folded.add(recent.popleft())
        recent.append(record)
        if count % MARK_EVERY == 0:
            marks.append((float(record["t"]), begins))
        count += 1
    if skipped:
        logger.warning("ipycloud skipped %d lines of the run log %s that are not records",
                       skipped, path)
    return _Kept(identity, offset, _fingerprint(descriptor, offset), tuple(recent), folded,
                 tuple(marks), count)


def _summarize(path: Path, kept: _Kept) -> Json:
    summary = _run(path, kept).to_json()
    summary["events"] += kept.folded.dropped[records.EVENT]
    summary["checkpoints"] += kept.folded.dropped[records.CHECKPOINT]
    return summary


def _run(path: Path, kept: _Kept) -> RunSummary:
    return summarize(path, [*kept.folded.lines(), *kept.recent])


def _after(found: Iterator[Json], since: float | None) -> list[Json]:
    chosen = []
    for record in found:
        if since is None or record["t"] > since:
            chosen.append(record)
            if len(chosen) == RECORDS_LIMIT:
                break
    return chosen


def _fingerprint(descriptor: int, offset: int) -> bytes:
    """The first and the last CHECKED bytes before ``offset``: a log cut and written again
    as long or longer changes them."""
    size = min(offset, CHECKED)
    if not size:
        return b""
    return os.pread(descriptor, size, 0) + os.pread(descriptor, size, offset - size)


def _whole_lines(descriptor: int, start: int, stop: int) -> Iterator[tuple[bytes, int]]:
    """The whole lines of the file between ``start`` and ``stop``, each with the offset
    just past its newline; a last line without its newline is left (still being written).
    A line longer than MAX_LINE comes as OVERLONG, without being held."""
    offset = position = start  # read up to; where the pending line starts
    pending, dropped = b"", 0  # the pending line's bytes held, and those let go
    while offset < stop:
        chunk = os.pread(descriptor, min(CHUNK, stop - offset), offset)
        if not chunk:
            return
        offset += len(chunk)
        *whole, pending = (pending + chunk).split(b"\n")
        for line in whole:
            position += dropped + len(line) + 1
            yield (OVERLONG if dropped else line), position
            dropped = 0
        if len(pending) > MAX_LINE:
            dropped, pending = dropped + len(pending), b""
