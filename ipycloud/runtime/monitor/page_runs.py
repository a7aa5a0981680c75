"""The runs of ``fit`` in this process (started here, or followed here with ``follow``), for
the ``api/runs`` routes of the dashboard page the kernel serves and its snapshots: read from
their run records, answered as the Jupyter server's routes of the same names answer them
(``ipycloud/server/README.md``), less the runs of other processes.

The page asks every second, so the runs are followed, not read anew: the user's index of
runs is read for its new or changed entries only, and only this process's logs, each for
the lines appended since the last look (ipycloud.runtime.runs.polled_logs: whatever the
files hold, the answers are strict JSON).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

from ipycloud.runtime.per_process import per_process
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.polled_logs import PolledLog
from ipycloud.runtime.runs.summary import RunSummary
from ipycloud.runtime.untrusted import strict_dumps

Json = dict[str, Any]


class NoSuchRun(LookupError):
    """No run of this process has that id."""


class ProcessRuns:
    """The runs this process started or follows on this machine, as their logs say now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[int, Path | None]] = {}  # index file: mtime, my log
        self._logs: dict[Path, PolledLog] = {}

    def logs(self) -> list[PolledLog]:
        """Each run's log as read now (each with a summary), the run updated last first."""
        with self._lock:
            tails = {path: self._logs.get(path) or PolledLog(path) for path in self._my_logs()}
            self._logs = {path: tail for path, tail in tails.items() if tail.look()}
            return sorted(self._logs.values(), key=_updated, reverse=True)

    def summaries(self) -> list[RunSummary]:
        """Each run's summary, the run updated last first."""
        return [tail.run() for tail in self.logs()]

    def _my_logs(self) -> list[Path]:
        """The logs the index names for this process (as their writer or a follower), its
        entries read when new or changed (a resumed run's entry is written again by the
        process that resumes it)."""
        me = (os.getpid(), socket.gethostname())
        try:
            with os.scandir(records.index_dir()) as scan:
                found = {entry.name: (entry.stat().st_mtime_ns, Path(entry.path))
                         for entry in scan if entry.name.endswith(".json")}
        except OSError:  # no index yet, or it cannot be read
            found = {}
        entries = {}
        for name, (changed, path) in found.items():
            known = self._entries.get(name)
            if known is None or known[0] != changed:
                entry = records.read_index_entry(path)
                mine = entry is not None and me in records.entry_processes(entry)
                log = Path(entry["log"]) if entry is not None and mine else None
                known = (changed, log)
            entries[name] = known
        self._entries = entries
        return [log for _, log in entries.values() if log is not None]


def _updated(tail: PolledLog) -> float:
    updated = tail.summary["updated"] if tail.summary else None
    return float(updated) if isinstance(updated, int | float) else 0.0


@per_process()
def process_runs() -> ProcessRuns:
    """This process's runs."""
    return ProcessRuns()


def runs_answer() -> bytes:
    """The JSON of ``api/runs``: ``{"runs": [summary, ...]}``."""
    return strict_dumps({"runs": [tail.summary for tail in process_runs().logs()]}).encode()


def run_answer(run_id: str, since: float | None) -> bytes:
    """The JSON of ``api/runs/<id>``: ``{"run": summary, "records": [records after
    since]}``; NoSuchRun where no run of this process has ``run_id``."""
    for tail in process_runs().logs():
        if tail.summary is not None and tail.summary["id"] == run_id:
            return strict_dumps({"run": tail.summary,
                                 "records": tail.records_after(since)}).encode()
    raise NoSuchRun(f"no run {run_id!r} in this kernel: api/runs lists its runs")
