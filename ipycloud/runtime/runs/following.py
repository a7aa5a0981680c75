"""Run logs followed as they grow, for the fronts that look again every second or so (the
Jupyter server's runs routes, the kernel's page): a log read again only when it changed,
and then only its appended lines parsed, into a state of bounded size (``LogReader``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs.log_reader import LogReader
from ipycloud.runtime.runs.summary import LIVE, RunSummary

Json = dict[str, Any]


@dataclass(frozen=True)
class FollowedLog:
    """A log's summary and kept records as of one state of the file. ``lines`` are the
    records the reader keeps (the newest start, at most MAX_STEP_ROWS step rows and
    MAX_EPOCH_ROWS epoch rows spread over the run, the last events and checkpoints, the
    end), in time order; ``summary`` is ``run`` as JSON (strict: no NaN)."""

    state: tuple[int, int, int]  # inode, size, modification time (ns)
    reader: LogReader
    lines: list[Json]
    run: RunSummary
    summary: Json

    def after(self, since: float | None) -> list[Json]:
        """The kept records whose time is after ``since`` (all of them for None)."""
        return self.lines if since is None else [line for line in self.lines
                                                 if line["t"] > since]


def read_log(path: Path, last: FollowedLog | None = None) -> FollowedLog | None:
    """The summary and kept records of the log at ``path``, given how ``last`` read it:
    read again when the log changed (only what was appended), the summary made again while
    the run is live (it may have died); None when it cannot be read or is no regular file
    (a symlink, a FIFO). A last line still being written waits for its newline."""
    try:
        stat = os.lstat(path)
        state = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if last is not None and last.state == state:
            if last.summary["status"] not in LIVE:
                return last
            run = last.reader.summary()
            return replace(last, run=run, summary=run.to_json())
        reader = last.reader if last is not None else LogReader(path)
        reader.read()
    except OSError:
        return None
    run = reader.summary()
    return FollowedLog(state, reader, reader.records(), run, run.to_json())
