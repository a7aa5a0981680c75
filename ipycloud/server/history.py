"""The machine's readings kept for a day, across the server's restarts.

Each reading, encoded as the ``history`` route gives it, is kept in memory and appended as
one line to a file (``IpycloudServer.history_file``). Every COMPACT_EVERY_S the readings
are thinned (THINNING: as sampled for the last minutes, one a second for the last hour, one
a minute before that), those older than the history's length dropped, and the file
rewritten from what is left, atomically. A server starting reads the file back and skips
the lines it cannot read (one cut short by a kill, a disk's garbage).

One server at a time writes the file, the one holding its lock file; another server of the
same user on the same machine keeps its readings in memory only. A file that cannot be
written never stops the sampling: the readings stay in memory and the next compaction
tries the file again.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ipycloud.runtime.durable import write_bytes_atomically
from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.monitor import strict_json

logger = logging.getLogger(__name__)

COMPACT_EVERY_S = 600.0
# (age, spacing): readings older than ``age`` seconds are thinned to one per ``spacing``.
THINNING = ((0.0, 1.0), (3600.0, 60.0))
LOCK_SUFFIX = ".lock"


class KeptHistory:
    """Readings (``time``, JSON text) in time order, thinned and kept in ``path`` (None:
    in memory only) for ``length_s`` seconds; thread-safe. ``clock`` gives the time."""

    def __init__(self, path: Path | None, length_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._length = length_s
        self._clock = clock
        self._times: list[float] = []
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._claim: int | None = None  # the lock file, held while this history writes
        self._file: int | None = None  # the history file, open for appending
        self._compacted = -math.inf

    def open(self) -> None:
        """Read back the readings an earlier server kept and, holding the file's lock, start
        writing them (reads and writes files: call it off the event loop)."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._claim = _claim(self.path.with_name(self.path.name + LOCK_SUFFIX))
            if self._claim is None:
                logger.info("ipycloud: another server writes %s; this one keeps its "
                            "readings in memory", self.path)
        except OSError as error:
            logger.warning("ipycloud keeps the machine's history in memory only: %s",
                           describe_error(error))
        kept = sorted(_readable(self.path))
        with self._lock:
            for stamp, line in kept:
                self._insert(stamp, line)
            self._compact()

    def add(self, stamp: float, line: str) -> None:
        """Keep the reading ``line`` (JSON text without a newline) taken at ``stamp``."""
        with self._lock:
            self._insert(stamp, line)
            if self._file is not None:
                try:
                    os.write(self._file, f"{line}\n".encode())
                except OSError as error:
                    self._stop_writing(error)
            if self._clock() - self._compacted >= COMPACT_EVERY_S:
                self._compact()

    def since(self, since: float | None = None) -> list[str]:
        """The readings kept with a time after ``since`` (all without one), oldest first."""
        with self._lock:
            start = 0 if since is None else bisect.bisect_right(self._times, since)
            return self._lines[start:]

    def close(self) -> None:
        """Stop writing the file and give up its lock (the readings stay readable)."""
        with self._lock:
            for descriptor in (self._file, self._claim):
                if descriptor is not None:
                    with contextlib.suppress(OSError):
                        os.close(descriptor)
            self._file = self._claim = None

    def _insert(self, stamp: float, line: str) -> None:
        position = bisect.bisect_right(self._times, stamp)
        self._times.insert(position, stamp)
        self._lines.insert(position, line)

    def _compact(self) -> None:
        """Thin and drop what is due, then rewrite the file (the caller holds the lock)."""
        now = self._compacted = self._clock()
        kept = list(thinned(zip(self._times, self._lines, strict=True), now, self._length))
        self._times = [stamp for stamp, _ in kept]
        self._lines = [line for _, line in kept]
        if self._claim is None or self.path is None:
            return
        if self._file is not None:
            os.close(self._file)
            self._file = None
        try:
            write_bytes_atomically(self.path, "".join(f"{line}\n" for line in self._lines)
                                   .encode())
            self._file = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as error:
            self._stop_writing(error)

    def _stop_writing(self, error: OSError) -> None:
        logger.warning("ipycloud could not write the machine's history to %s (%s); it keeps "
                       "it in memory and tries again in %g minutes", self.path,
                       describe_error(error), COMPACT_EVERY_S / 60)
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.close(self._file)
            self._file = None


def thinned(readings: Iterable[tuple[float, str]], now: float,
            length_s: float) -> Iterable[tuple[float, str]]:
    """The readings (in time order) younger than ``length_s`` at ``now``, thinned to the
    spacing THINNING gives their age: the first of each spacing-long slice of time (slices
    counted from the epoch, so thinning again keeps the same readings)."""
    last: tuple[float, int] | None = None
    for stamp, line in readings:
        age = now - stamp
        if age > length_s:
            continue
        spacing = max(spacing for older_than, spacing in THINNING if age >= older_than)
        bucket = (spacing, math.floor(stamp / spacing))
        if bucket != last:
            last = bucket
            yield stamp, line


def _claim(lock_path: Path) -> int | None:
    """The lock file's descriptor, holding its lock; None when another process holds it."""
    import fcntl

    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    except OSError:  # a file system without locks: write without one
        pass
    return descriptor


def _readable(path: Path) -> Iterable[tuple[float, str]]:
    """The readings of the history file, each line a JSON object with a finite ``time``;
    other lines are skipped. Nothing when the file cannot be read."""
    try:
        with path.open("rb") as file:
            raw_lines = file.read().splitlines()
    except FileNotFoundError:
        return
    except OSError as error:
        logger.warning("ipycloud could not read the machine's history in %s: %s", path,
                       describe_error(error))
        return
    skipped = 0
    for raw in raw_lines:
        try:
            reading = json.loads(raw)
            stamp = float(reading["time"])
        except (ValueError, TypeError, KeyError, RecursionError):
            skipped += 1
            continue
        if math.isfinite(stamp):
            strict = b"NaN" not in raw and b"Infinity" not in raw  # as an older server wrote
            yield stamp, raw.decode().strip() if strict else strict_json.dumps(reading)
        else:
            skipped += 1
    if skipped:
        logger.warning("ipycloud skipped %d unreadable lines of %s", skipped, path)
