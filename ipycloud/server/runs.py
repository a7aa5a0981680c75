"""The runs of ``fit`` a server shows: those the user's index of runs gives for the server's
kernels or with a log under its root folder, and the logs a bounded walk of the root folder
finds in ``.ipycloud-runs`` folders.

Everything here reads files: the handlers call it in an executor thread. Many clients poll
at once, so what one request finds serves the others: the runs found for FRESH_S seconds
(looking again, and walking the root every SCAN_FRESH_S, on one thread while the others
answer from the previous findings), each log's records and summary for FRESH_S; a log is
parsed again only when its size or time changed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.summary import RUNNING, summarize

Json = dict[str, Any]

SCAN_DEPTH = 6  # folders below the root the walk goes down
SCAN_FOLDERS = 5000  # folders it reads at most
SCAN_SECONDS = 2.0  # and for at most this long
SCAN_FRESH_S = 5.0  # its findings serve this long
FRESH_S = 1.0  # the runs found, and each log's records and summary, serve this long
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "site-packages"})  # and hidden ones


@dataclass(frozen=True)
class _Log:
    """A log's records and summary as of one state of the file."""

    state: tuple[int, int, int]  # inode, size, modification time (ns)
    lines: list[Json]
    summary: Json
    read_at: float  # the clock when the state was looked at


@dataclass(frozen=True)
class _Found:
    """The server's run logs by run id, as found at one time."""

    kernels: Collection[str]
    logs: dict[str, Path]
    found_at: float


class RunFinder:
    """The runs of one server: ``root`` is its root folder; ``clock`` (monotonic seconds)
    times what is kept. Thread-safe: one thread at a time looks for logs or reads one,
    and the others then use what it found."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._root = Path(os.path.abspath(root))
        self._clock = clock
        self._walk: list[Path] | None = None  # the last walk's logs
        self._walked_at = 0.0
        self._found: _Found | None = None
        self._finding = threading.Lock()
        self._logs: dict[Path, _Log] = {}
        self._reading = threading.Lock()

    def summaries(self, kernels: Collection[str]) -> list[Json]:
        """The summary (RunSummary JSON) of each run, newest first; ``kernels`` are the ids
        of the server's kernels."""
        read = [self._read(log) for log in self._found_logs(kernels).values()]
        found = [log.summary for log in read if log is not None]
        return sorted(found, key=lambda summary: summary["updated"] or 0.0, reverse=True)

    def run(self, run_id: str, kernels: Collection[str],
            since: float | None) -> tuple[Json, list[Json]] | None:
        """The summary of the run ``run_id`` and its records after ``since`` (all without);
        None when the server has no run of that id or its log can no longer be read."""
        path = self._found_logs(kernels).get(run_id)
        log = None if path is None else self._read(path)
        if log is None:
            return None
        newer = log.lines if since is None else [line for line in log.lines if line["t"] > since]
        return log.summary, newer

    def _found_logs(self, kernels: Collection[str]) -> dict[str, Path]:
        """The server's run logs by run id (of two logs of one id, the one changed last),
        looked for again when FRESH_S old, by one thread while the others use the previous
        findings, or at once for other kernels."""
        found = self._found
        current = found is not None and found.kernels == kernels
        if found is not None and current and self._clock() - found.found_at < FRESH_S:
            return found.logs
        if not self._finding.acquire(blocking=not current):
            assert found is not None
            return found.logs
        try:
            paths = dict.fromkeys([*self._indexed(kernels), *self._walked()])
            by_id: dict[str, Path] = {}
            for path in paths:
                other = by_id.get(path.stem)
                if other is None or _changed(path) > _changed(other):
                    by_id[path.stem] = path
            self._found = _Found(kernels, by_id, self._clock())
        finally:
            self._finding.release()
        with self._reading:  # forget the logs no longer found
            self._logs = {path: log for path, log in self._logs.items() if path in paths}
        return by_id

    def _indexed(self, kernels: Collection[str]) -> Iterator[Path]:
        """The logs of the user's index whose run is of one of ``kernels`` or under the
        root, where they are files."""
        try:
            entries = list(records.index_dir().glob("*.json"))
        except OSError:
            return
        for path in entries:
            entry = _index_entry(path)
            if entry is None:
                continue
            log = Path(os.path.abspath(entry["log"]))
            if ((entry.get("kernel") in kernels or log.is_relative_to(self._root))
                    and _is_file(log)):
                yield log

    def _walked(self) -> list[Path]:
        """The logs the last walk of the root found, walked again when SCAN_FRESH_S old
        (called by the one thread looking for logs)."""
        if self._walk is None or self._clock() - self._walked_at >= SCAN_FRESH_S:
            self._walk = walk(self._root, self._clock)
            self._walked_at = self._clock()
        return self._walk

    def _read(self, path: Path) -> _Log | None:
        """The records and summary of the log at ``path``: looked at again when FRESH_S
        old, parsed again only when the file changed, summarized again then or while the
        run is running (it may have died); None when it cannot be read."""
        with self._reading:
            now = self._clock()
            log = self._logs.get(path)
            if log is not None and now - log.read_at < FRESH_S:
                return log
            try:
                stat = path.stat()
                state = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                same = log is not None and log.state == state
                lines = log.lines if log is not None and same else records.read_records(path)
            except OSError:
                return None
            if log is not None and same and log.summary["status"] != RUNNING:
                summary = log.summary
            else:
                summary = summarize(path, lines).to_json()
            self._logs[path] = log = _Log(state, lines, summary, now)
            return log


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


def _index_entry(path: Path) -> Json | None:
    """An entry of the index that names its log; None for anything else."""
    try:
        entry = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("log"), str) else None


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _changed(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0
