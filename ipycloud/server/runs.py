"""The runs of ``fit`` a server shows: those the user's index of runs gives for the server's
kernels (started or followed in one of them, wherever their logs lie: a bucket mounted
outside the root) or with a log under its root folder, and the logs a bounded walk of the
root folder finds in ``.ipycloud-runs`` folders.

Everything here reads files: the handlers call it in an executor thread. Many clients poll
at once, so one view of the runs (their logs' records and summaries) serves them all. A
request that finds the view FRESH_S old has it made again on a thread of its own and
answers from the one it found, so no request waits for the files but the first, or one
made for another set of kernels. Making the view parses only the lines appended to a log
since the last one, and walks the root folder only every SCAN_FRESH_S.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.following import FollowedLog, read_log

Json = dict[str, Any]

SCAN_DEPTH = 6  # folders below the root the walk goes down
SCAN_FOLDERS = 5000  # folders it reads at most
SCAN_SECONDS = 2.0  # and for at most this long
SCAN_FRESH_S = 5.0  # its findings serve this long
FRESH_S = 1.0  # the view of the runs serves this long before it is made again
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "site-packages"})  # and hidden ones


@dataclass(frozen=True)
class _View:
    """The server's runs as found at one time."""

    kernels: Collection[str]  # the kernels it was made for
    logs: dict[str, FollowedLog]  # by run id
    summaries: list[Json]  # newest first
    made_at: float


def _in_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="ipycloud-runs", daemon=True).start()


class RunFinder:
    """The runs of one server: ``root`` is its root folder; ``clock`` (monotonic seconds)
    times the view; ``background`` runs the making of a view that is due (on a thread of
    its own). Thread-safe."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.monotonic,
                 background: Callable[[Callable[[], None]], None] = _in_thread) -> None:
        self._root = Path(os.path.abspath(root))
        self._clock = clock
        self._background = background
        self._view: _View | None = None
        self._making = threading.Lock()  # held while a view is made
        self._walk: list[Path] | None = None  # the last walk's logs
        self._walked_at = 0.0
        self._logs: dict[Path, FollowedLog] = {}  # as the last view read them

    def summaries(self, kernels: Collection[str]) -> list[Json]:
        """The summary (RunSummary JSON) of each run, newest first; ``kernels`` are the ids
        of the server's kernels."""
        return self._current(kernels).summaries

    def run(self, run_id: str, kernels: Collection[str],
            since: float | None) -> tuple[Json, list[Json]] | None:
        """The summary of the run ``run_id`` and its records after ``since`` (all without);
        None when the server has no run of that id."""
        log = self._current(kernels).logs.get(run_id)
        if log is None:
            return None
        return log.summary, log.after(since)

    def _current(self, kernels: Collection[str]) -> _View:
        """The view for ``kernels``: made now when there is none for them, else the one
        there is, a new one being made in the background when it is FRESH_S old."""
        view = self._view
        if view is None or view.kernels != kernels:
            with self._making:
                view = self._view
                return (view if view is not None and view.kernels == kernels
                        else self._make(kernels))
        if self._clock() - view.made_at >= FRESH_S and self._making.acquire(blocking=False):
            self._background(lambda: self._make_and_release(kernels))
        return self._view or view

    def _make_and_release(self, kernels: Collection[str]) -> None:
        try:
            self._make(kernels)
        finally:
            self._making.release()

    def _make(self, kernels: Collection[str]) -> _View:
        """Find the logs and read them into a new view (the caller holds ``_making``)."""
        paths = dict.fromkeys([*self._indexed(kernels), *self._walked()])
        read = {path: log for path, log in zip(paths, map(self._read, paths), strict=True)
                if log is not None}
        by_id: dict[str, FollowedLog] = {}
        for path, log in read.items():  # of two logs of one run, the one changed last
            other = by_id.get(path.stem)
            if other is None or log.state[2] > other.state[2]:
                by_id[path.stem] = log
        summaries = sorted((log.summary for log in by_id.values()),
                           key=lambda summary: summary["updated"] or 0.0, reverse=True)
        self._logs = read
        self._view = _View(kernels, by_id, summaries, self._clock())
        return self._view

    def _indexed(self, kernels: Collection[str]) -> Iterator[Path]:
        """The logs of the user's index whose run is of one of ``kernels`` (started or
        followed there) or under the root, where they are files."""
        try:
            entries = list(records.index_dir().glob("*.json"))
        except OSError:
            return
        for path in entries:
            entry = records.read_index_entry(path)
            if entry is None:
                continue
            log = Path(os.path.abspath(entry["log"]))
            ours = any(kernel in kernels for kernel in records.entry_kernels(entry))
            if (ours or log.is_relative_to(self._root)) and _is_file(log):
                yield log

    def _walked(self) -> list[Path]:
        """The logs the last walk of the root found, walked again when SCAN_FRESH_S old."""
        if self._walk is None or self._clock() - self._walked_at >= SCAN_FRESH_S:
            self._walk = walk(self._root, self._clock)
            self._walked_at = self._clock()
        return self._walk

    def _read(self, path: Path) -> FollowedLog | None:
        return read_log(path, self._logs.get(path))


def walk(root: Path, clock: Callable[[], float] = time.monotonic) -> list[Path]:
    """The run logs in the ``.ipycloud-runs`` folders under ``root``, found by a walk that
    skips hidden folders, SKIPPED_FOLDERS and links, and stops at SCAN_DEPTH folders down,
    SCAN_FOLDERS folders read or SCAN_SECONDS, whichever comes first."""
    deadline = clock() + SCAN_SECONDS
    logs: list[Path] = []
    pending = deque([(root, 0)])  # breadth first: a bound stops the walk in the deepest
    read = 0
    while pending and read < SCAN_FOLDERS and clock() < deadline:
        folder, depth = pending.popleft()
        read += 1
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    if entry.name == records.RECORD_FOLDER:
                        logs.extend(_logs_in(Path(entry.path)))
                    elif (depth < SCAN_DEPTH and not entry.name.startswith(".")
                          and entry.name not in SKIPPED_FOLDERS):
                        pending.append((Path(entry.path), depth + 1))
        except OSError:  # a folder that cannot be read (permissions, a vanished mount)
            continue
    return logs


def _logs_in(folder: Path) -> list[Path]:
    try:
        return records.logs_in(folder)
    except OSError:
        return []


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False
