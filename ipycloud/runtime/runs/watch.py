"""One run watched through its log as the log grows, wherever it is written: on this
machine, or on the nodes of a cluster into a bucket this machine mounts or syncs.

Each ``look`` reads only the lines appended since the last (``records.read_records``
keeps what it read) and sums the run up again, judging a live run by the clock now.
``find_log`` picks the log to watch in a checkpoint folder.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.reading import UnknownRunError, checkpoint_folder, runs
from ipycloud.runtime.runs.summary import summarize

Json = dict[str, Any]
NAMED_RUNS = 5  # the ids of a folder's runs an unknown run's error names at most


@dataclass(frozen=True)
class Change:
    """What a look found: the records ``appended`` since the last look, and whether the
    earlier ones are ``renewed``: the first look, a log replaced or cut (read afresh), or
    a new start (a resumed run redoes the steps after the one it resumed at)."""

    appended: list[Json] = field(default_factory=list)
    renewed: bool = False


class RunWatch:
    """The run whose log is at ``log``, judged by ``clock`` (Unix seconds)."""

    def __init__(self, log: Path, clock: Callable[[], float] = time.time) -> None:
        self.log = log
        self.clock = clock
        self.lines: list[Json] = []
        self.failure: OSError | None = None  # why the last look could not read the log
        self.summary = summarize(log, [], now=clock())

    def look(self) -> Change:
        """Read what was appended to the log and sum the run up again. A log that cannot
        be read (a mount gone) keeps the lines read before, and ``failure`` says why."""
        try:
            lines = records.read_records(self.log, torn_tail=False)
        except OSError as error:
            self.failure = error
            self.summary = summarize(self.log, self.lines, now=self.clock())
            return Change()
        self.failure = None
        seen = len(self.lines)
        if seen and len(lines) >= seen and lines[seen - 1] == self.lines[-1]:
            appended = lines[seen:]
            change = Change(appended, any(line["kind"] == records.START for line in appended))
        else:  # the first look, or the log was replaced or cut
            change = Change(lines, renewed=True)
        self.lines = lines
        self.summary = summarize(self.log, lines, now=self.clock())
        return change


def find_log(folder: str | os.PathLike[str], run: str | None = None) -> Path:
    """The log of ``run`` (an id) among the runs recorded in the checkpoint ``folder``, or
    of the newest of them (the first ``runs(folder)`` lists). One-line errors: the
    FileNotFoundError or NotADirectoryError of a folder that is none, the OSError of one
    that cannot be read, UnknownRunError for no run (of that id) there, ValueError for a
    ``run`` that is no run id."""
    if run is not None and not (isinstance(run, str) and records.RUN_ID.fullmatch(run)):
        raise ValueError(f"run is a run's id, 12 hex digits as ipycloud.runs lists them, "
                         f"not {run!r}")
    path = checkpoint_folder(Path(folder))
    try:
        found = runs(path)
    except OSError as error:
        raise type(error)(f"cannot read the folder {str(path)!r}: "
                          f"{error.strerror or error}") from None
    if not found:
        raise UnknownRunError(f"no runs in {str(path)!r}: fit records each run there, in "
                              f"{records.RECORD_FOLDER}, once it starts")
    if run is None:
        return found[0].log
    for summary in found:
        if summary.id == run:
            return summary.log
    ids = ", ".join(summary.id for summary in found[:NAMED_RUNS])
    more = ", ..." if len(found) > NAMED_RUNS else ""
    raise UnknownRunError(f"no run {run} in {str(path)!r}; its runs: {ids}{more}")
