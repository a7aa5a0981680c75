"""One run watched through its log as the log grows, wherever it is written: on this
machine, or on the nodes of a cluster into a bucket this machine mounts or syncs.

Each ``look`` reads only the lines appended since the last (``log_reader.LogReader``, in
bounded memory) and sums the run up again, judging a live run by the clock now.
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
from ipycloud.runtime.runs.log_reader import LogReader
from ipycloud.runtime.runs.reading import UnknownRunError, checkpoint_folder, runs

Json = dict[str, Any]
NAMED_RUNS = 5  # the ids of a folder's runs an unknown run's error names at most


@dataclass(frozen=True)
class Change:
    """What a look found: the records ``appended`` since the last look, and whether the
    earlier ones are ``renewed``: the first look, a log replaced or cut (read afresh), a
    new start (a resumed run redoes the steps after the one it resumed at), or more
    records than one look hands on (build the view again from the summary's rows)."""

    appended: list[Json] = field(default_factory=list)
    renewed: bool = False


class RunWatch:
    """The run whose log is at ``log``, judged by ``clock`` (Unix seconds)."""

    def __init__(self, log: Path, clock: Callable[[], float] = time.time) -> None:
        self.log = log
        self.clock = clock
        self.reader = LogReader(log)
        self.failure: OSError | None = None  # why the last look could not read the log
        self.summary = self.reader.summary(now=clock())

    @property
    def read_any(self) -> bool:
        """Whether a record of the run was read."""
        return self.reader.state.count > 0

    def look(self) -> Change:
        """Read what was appended to the log and sum the run up again. A log that cannot
        be read (a mount gone) keeps what was read before, and ``failure`` says why."""
        try:
            update = self.reader.read()
        except OSError as error:
            self.failure = error
            self.summary = self.reader.summary(now=self.clock())
            return Change()
        self.failure = None
        self.summary = self.reader.summary(now=self.clock())
        return Change(update.appended, update.renewed or any(
            line["kind"] == records.START for line in update.appended))


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
