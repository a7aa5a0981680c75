"""The runs of ``fit`` a server shows: those the user's index of runs gives for the server's
kernels or with a log under its root folder, and the logs a bounded walk of the root folder
finds in ``.ipycloud-runs`` folders.

Everything here reads files: the handlers call it in an executor thread. Many clients poll
at once, so the walk's findings serve SCAN_FRESH_S seconds (a walk that is due runs on one
thread while the others answer from the previous one), and a log is parsed again only when
its size or time changed.
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
from ipycloud.runtime.runs.summary import summarize

Json = dict[str, Any]

SCAN_DEPTH = 6  # folders below the root the walk goes down
SCAN_FOLDERS = 5000  # folders it reads at most
SCAN_SECONDS = 2.0  # and for at most this long
SCAN_FRESH_S = 5.0  # its findings serve this long
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "site-packages"})  # and hidden ones


@dataclass(frozen=True)
class _Parsed:
    """A log's records as of one state of the file."""

    state: tuple[int, int, int]  # inode, size, modification time (ns)
    lines: list[Json]


class RunFinder:
    """The runs of one server: ``root`` is its root folder; ``clock`` (monotonic seconds)
    times the walk's findings. Thread-safe."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._root = Path(os.path.abspath(root))
        self._clock = clock
        self._found: list[Path] | None = None  # the last walk's logs
        self._found_at = 0.0
        self._walking = threading.Lock()
        self._parsed: dict[Path, _Parsed] = {}
        self._parsed_lock = threading.Lock()

    def summaries(self, kernels: Collection[str]) -> list[Json]:
        """The summary (RunSummary JSON) of each run, newest first; ``kernels`` are the ids
        of the server's kernels."""
        found = [summary for summary in map(self._summary, self._logs(kernels).values())
                 if summary is not None]
        return sorted(found, key=lambda summary: summary["updated"] or 0.0, reverse=True)

    def run(self, run_id: str, kernels: Collection[str],
            since: float | None) -> tuple[Json, list[Json]] | None:
        """The summary of the run ``run_id`` and its records after ``since`` (all without);
        None when the server has no run of that id or its log can no longer be read."""
        log = self._logs(kernels).get(run_id)
        lines = None if log is None else self._lines(log)
        if log is None or lines is None:
            return None
        newer = lines if since is None else [line for line in lines if line["t"] > since]
        return summarize(log, lines).to_json(), newer

    def _logs(self, kernels: Collection[str]) -> dict[str, Path]:
        """The server's run logs by run id (of two logs of one id, the one changed last)."""
        logs = dict.fromkeys([*self._indexed(kernels), *self._walked()])
        by_id: dict[str, Path] = {}
        for log in logs:
            other = by_id.get(log.stem)
            if other is None or _changed(log) > _changed(other):
                by_id[log.stem] = log
        with self._parsed_lock:  # forget the logs no longer found
            self._parsed = {log: parsed for log, parsed in self._parsed.items() if log in logs}
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
        """The logs the last walk of the root found; a walk is made when those are older
        than SCAN_FRESH_S, by one thread while the others use the previous findings."""
        if self._found is not None and self._clock() - self._found_at < SCAN_FRESH_S:
            return self._found
        if self._walking.acquire(blocking=self._found is None):
            try:
                if self._found is None or self._clock() - self._found_at >= SCAN_FRESH_S:
                    self._found = walk(self._root, self._clock)
                    self._found_at = self._clock()
            finally:
                self._walking.release()
        return self._found or []

    def _summary(self, log: Path) -> Json | None:
        lines = self._lines(log)
        return None if lines is None else summarize(log, lines).to_json()

    def _lines(self, log: Path) -> list[Json] | None:
        """The records of ``log``, parsed again only when it changed; None when it cannot
        be read."""
        try:
            stat = log.stat()
            state = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            with self._parsed_lock:
                parsed = self._parsed.get(log)
            if parsed is not None and parsed.state == state:
                return parsed.lines
            lines = records.read_records(log)
        except OSError:
            return None
        with self._parsed_lock:
            self._parsed[log] = _Parsed(state, lines)
        return lines


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
