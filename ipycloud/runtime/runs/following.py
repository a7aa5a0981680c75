"""Run logs followed as they grow, for the fronts that look again every second or so (the
Jupyter server's runs routes, the kernel's page): a log read again only when it changed,
and then only its appended lines parsed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.summary import LIVE, summarize

Json = dict[str, Any]


@dataclass(frozen=True)
class FollowedLog:
    """A log's records and summary as of one state of the file."""

    state: tuple[int, int, int]  # inode, size, modification time (ns)
    lines: list[Json]
    summary: Json  # RunSummary JSON

    def after(self, since: float | None) -> list[Json]:
        """The records whose time is after ``since`` (all of them for None)."""
        return self.lines if since is None else [line for line in self.lines
                                                 if line["t"] > since]


def read_log(path: Path, last: FollowedLog | None = None) -> FollowedLog | None:
    """The records and summary of the log at ``path``, given how ``last`` read it: read
    again when the log changed (``records.read_records`` parses only what was appended),
    the summary made again while the run is live (it may have died); None when it
    cannot be read. A last line still being written waits for its newline."""
    try:
        stat = path.stat()
        state = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if last is not None and last.state == state:
            if last.summary["status"] not in LIVE:
                return last
            return replace(last, summary=summarize(path, last.lines).to_json())
        lines = records.read_records(path, torn_tail=False)
    except OSError:
        return None
    return FollowedLog(state, lines, summarize(path, lines).to_json())
