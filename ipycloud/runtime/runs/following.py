"""Run logs followed as they grow: each read parses only the lines appended since the last
one (the whole file when it was replaced or is shorter), for the fronts that look again
every second or so (the Jupyter server's runs routes, the kernel's page)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.summary import RUNNING, summarize

Json = dict[str, Any]


@dataclass(frozen=True)
class FollowedLog:
    """A log's records and summary as of one state of the file."""

    state: tuple[int, int, int]  # inode, size, modification time (ns)
    parsed: int  # the bytes of whole lines parsed, from the start
    lines: list[Json]
    summary: Json  # RunSummary JSON

    def after(self, since: float | None) -> list[Json]:
        """The records whose time is after ``since`` (all of them for None)."""
        return self.lines if since is None else [line for line in self.lines
                                                 if line["t"] > since]


def read_log(path: Path, last: FollowedLog | None = None) -> FollowedLog | None:
    """The records and summary of the log at ``path``, given how ``last`` read it: the
    lines appended since parsed, the summary made again when the log changed or while the
    run is running (it may have died); None when it cannot be read."""
    try:
        stat = path.stat()
        state = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if last is not None and last.state == state:
            if last.summary["status"] != RUNNING:
                return last
            return replace(last, summary=summarize(path, last.lines).to_json())
        grown = last is not None and last.state[0] == stat.st_ino and stat.st_size >= last.parsed
        start = last.parsed if last is not None and grown else 0
        with path.open("rb") as file:
            file.seek(start)
            appended = file.read()
    except OSError:
        return None
    whole = appended.rfind(b"\n") + 1  # a last line without its newline is being written
    new = [record for record in map(records.parse_record, appended[:whole].splitlines())
           if record is not None]
    lines = last.lines + new if last is not None and grown else new
    return FollowedLog(state, start + whole, lines, summarize(path, lines).to_json())


def index_entry(path: Path) -> Json | None:
    """An entry of the user's index of runs that names its log; None for anything else."""
    try:
        entry = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("log"), str) else None
