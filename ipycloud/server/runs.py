"""The runs of ``fit`` a server shows: those the user's index of runs gives for the server's
kernels (started or followed in one of them, wherever their logs lie: a bucket mounted
outside the root) or with a log under its root folder, and the logs a bounded walk of the
root folder finds in ``.ipycloud-runs`` folders.

Everything here reads files: the handlers call it on the runs' own threads (``executor``),
never on those other routes use. Many clients poll at once, so one view of the runs (each
log followed, its summaries encoded once) serves them all. A request that finds the view
FRESH_S old has it made again on a thread of its own and answers from the one it found;
one made for another set of kernels is made at once, unless a making is under way: then
the last view answers. No request waits on another's reading of files, but for the first
view, at most FIRST_VIEW_WAIT_S. Logs are followed by ipycloud.runtime.runs.polled_logs:
regular files only, never through a link, their appended bytes only, what is kept of each
bounded. A log under the root that is a link, or lies outside the root once its links are
resolved, is not the server's unless a kernel of its own named it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.polled_logs import PolledLog
from ipycloud.runtime.untrusted import strict_dumps

Json = dict[str, Any]

SCAN_DEPTH = 6  # folders below the root the walk goes down
SCAN_FOLDERS = 5000  # folders it reads at most
SCAN_SECONDS = 2.0  # and for at most this long
SCAN_FRESH_S = 5.0  # its findings serve this long
FRESH_S = 1.0  # the view of the runs serves this long before it is made again
FIRST_VIEW_WAIT_S = 20.0  # a request finding the first view being made waits this long
RUNS_THREADS = 4  # the threads answering the runs routes
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "site-packages"})  # and hidden ones


class RunsNotReady(RuntimeError):
    """The first view of the runs is still being made."""


@dataclass(frozen=True)
class _View:
    """The server's runs as found at one time."""

    kernels: Collection[str]  # the kernels it was made for
    logs: dict[str, PolledLog]  # by run id
    summaries: list[Json]  # newest first
    body: str  # the ``runs`` route's answer: strict JSON
    made_at: float


def _in_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="ipycloud-runs-view", daemon=True).start()


class RunFinder:
    """The runs of one server: ``root`` is its root folder; ``clock`` (monotonic seconds)
    times the view; ``background`` runs the making of a view that is due (on a thread of
    its own). Thread-safe; ``executor`` is where the server's handlers call it."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.monotonic,
                 background: Callable[[Callable[[], None]], None] = _in_thread) -> None:
        self._root = Path(os.path.abspath(root))
        self._real_root = Path(os.path.realpath(root))
        self._clock = clock
        self._background = background
        self.executor = ThreadPoolExecutor(RUNS_THREADS, thread_name_prefix="ipycloud-runs")
        self._view: _View | None = None
        self._made = threading.Event()  # set once there is a view
        self._claim = threading.Lock()  # guards _making only: never held while reading
        self._making = False  # a view is being made
        self._walk: list[Path] | None = None  # the last walk's logs
        self._walked_at = 0.0
        self._tails: dict[Path, PolledLog] = {}  # as the last view followed them
        self._index: dict[Path, tuple[tuple[int, int, int], Json | None]] = {}

    def prepare(self, kernels: Collection[str]) -> None:
        """Start making the view for ``kernels`` in the background, unless a making is
        under way."""
        if self._start_making():
            self._background(lambda: self._make_and_release(kernels))

    def summaries(self, kernels: Collection[str]) -> list[Json]:
        """The summary (RunSummary JSON) of each run, newest first; ``kernels`` are the ids
        of the server's kernels. RunsNotReady while the first view is being made."""
        return self._current(kernels).summaries

    def ready_json(self, kernels: Collection[str]) -> str | None:
        """The ``runs`` route's answer where a view for ``kernels`` is there, without
        reading a file (a view that is due is made in the background); else None."""
        view = self._view
        if view is None or view.kernels != kernels:
            return None
        if self._clock() - view.made_at >= FRESH_S:
            self.prepare(kernels)
        return view.body

    def runs_json(self, kernels: Collection[str]) -> str:
        """The ``runs`` route's answer (strict JSON), as ``summaries``."""
        return self._current(kernels).body

    def run(self, run_id: str, kernels: Collection[str],
            since: float | None) -> tuple[Json, list[Json]] | None:
        """The summary of the run ``run_id`` and its first records after ``since`` (from
        the first without), at most log_reader.RECORDS_LIMIT; None when the server has no run
        of that id. The summary is the last view's; the records are those read so far, which
        may be a look ahead of it."""
        tail = self._current(kernels).logs.get(run_id)
        if tail is None or tail.summary is None:
            return None
        return tail.summary, tail.records_after(since)

    def run_json(self, run_id: str, kernels: Collection[str], since: float | None) -> str | None:
        """The ``runs/<id>`` route's answer (strict JSON), as ``run``."""
        found = self.run(run_id, kernels, since)
        return None if found is None else strict_dumps({"run": found[0], "records": found[1]})

    def _current(self, kernels: Collection[str]) -> _View:
        """The view for ``kernels``: made now when there is none for them and no making is
        under way, else the one there is (the first: waited for), a new one being made in
        the background when it is FRESH_S old."""
        view = self._view
        if view is not None and view.kernels == kernels:
            stale, due = False, self._clock() - view.made_at >= FRESH_S
        else:
            stale = due = True
        if stale and self._start_making():
            try:
                return self._make(kernels)
            finally:
                self._done_making()
        if due and not stale:
            self.prepare(kernels)
        current = self._view
        if current is None and self._made.wait(FIRST_VIEW_WAIT_S):
            current = self._view
        if current is None:
            raise RunsNotReady("the server is still reading the runs' logs: ask again")
        return current

    def _start_making(self) -> bool:
        with self._claim:
            if self._making:
                return False
            self._making = True
            return True

    def _done_making(self) -> None:
        with self._claim:
            self._making = False

    def _make_and_release(self, kernels: Collection[str]) -> None:
        try:
            self._make(kernels)
        finally:
            self._done_making()

    def _make(self, kernels: Collection[str]) -> _View:
        """Find the logs and follow them into a new view (one making at a time)."""
        paths = dict.fromkeys([*self._indexed(kernels), *self._walked()])
        tails = {path: self._tails.get(path) or PolledLog(path) for path in paths}
        followed = {path: tail for path, tail in tails.items() if tail.look()}
        by_id: dict[str, PolledLog] = {}
        for path, tail in followed.items():  # of two logs of one run, the one changed last
            other = by_id.get(path.stem)
            if other is None or tail.changed_ns > other.changed_ns:
                by_id[path.stem] = tail
        summaries = sorted((tail.summary for tail in by_id.values() if tail.summary),
                           key=_updated, reverse=True)
        self._tails = followed
        self._view = _View(kernels, by_id, summaries, strict_dumps({"runs": summaries}),
                           self._clock())
        self._made.set()
        return self._view

    def _indexed(self, kernels: Collection[str]) -> Iterator[Path]:
        """The logs of the user's index whose run is of one of ``kernels`` (started or
        followed there) or under the root (links resolved), where they are files."""
        try:
            with os.scandir(records.index_dir()) as scan:
                entries = [Path(entry.path) for entry in scan if entry.name.endswith(".json")]
        except OSError:
            return
        for path in entries:
            entry = self._index_entry(path)
            if entry is None:
                continue
            log = Path(os.path.abspath(entry["log"]))
            ours = any(kernel in kernels for kernel in records.entry_kernels(entry))
            if (ours or self._contains(log)) and _is_file(log):
                yield log

    def _index_entry(self, path: Path) -> Json | None:
        """An entry of the index, read again only when its file changed; None where it is
        not one (nor a regular file)."""
        try:
            status = path.lstat()
        except OSError:
            return None
        state = (status.st_ino, status.st_size, status.st_mtime_ns)
        known = self._index.get(path)
        if known is None or known[0] != state:
            known = (state, records.read_index_entry(path))
            self._index[path] = known
        return known[1]

    def _contains(self, log: Path) -> bool:
        """Whether ``log`` lies under the root, its links resolved."""
        try:
            return Path(os.path.realpath(log)).is_relative_to(self._real_root)
        except (OSError, ValueError):
            return False

    def _walked(self) -> list[Path]:
        """The logs the last walk of the root found, walked again when SCAN_FRESH_S old."""
        if self._walk is None or self._clock() - self._walked_at >= SCAN_FRESH_S:
            self._walk = walk(self._root, self._clock)
            self._walked_at = self._clock()
        return self._walk


def walk(root: Path, clock: Callable[[], float] = time.monotonic) -> list[Path]:
    """The run logs in the ``.ipycloud-runs`` folders under ``root``, found by a walk that
    skips hidden folders, SKIPPED_FOLDERS and links, and stops at SCAN_DEPTH folders down,
    SCAN_FOLDERS folders read or SCAN_SECONDS, whichever comes first."""
    deadline = clock() + SCAN_SECONDS
    return records.find_logs(root, SCAN_DEPTH, SCAN_FOLDERS, skipped=SKIPPED_FOLDERS,
                             until=lambda: clock() >= deadline)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _updated(summary: Json) -> float:
    updated = summary["updated"]
    return float(updated) if isinstance(updated, int | float) else 0.0
