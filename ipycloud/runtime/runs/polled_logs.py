"""Run logs followed by the fronts that look again every second or so (the Jupyter
server's runs routes, the kernel's page), whatever the files hold: each look reads only
what was appended (``LogReader``: regular files only, never through a link, never waiting
on a FIFO, in bounded memory, in the background: other threads are let in), at most
LOOK_BYTES of it (a huge log is taken over several looks, none of which keeps its front
waiting), and sums the run up again only when its log changed or the run is live (its
process may have died since)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.runs.log_reader import LogReader
from ipycloud.runtime.runs.summary import LIVE, RunSummary

logger = logging.getLogger(__name__)

Json = dict[str, Any]

LOOK_BYTES = 4 << 20  # of a log read by one look at most


class PolledLog:
    """One run log followed as it grows: one thread looks, any may read what it found."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader = LogReader(path)
        self.look_bytes = LOOK_BYTES
        self.summary: Json | None = None  # RunSummary JSON (strict), as of the last look
        self.changed_ns = 0  # the log's modification time at the last look
        self._state: tuple[int, int, int] | None = None  # inode, size, mtime of the look
        self._failure: str | None = None  # why the last summary could not be made

    def look(self) -> bool:
        """Read what was appended since the last look (at most ``look_bytes``, the rest
        left to the next looks) and sum the run up again where that may change it; whether
        ``summary`` holds one. False where the log cannot be read (gone, no regular file);
        a log whose records the summary cannot take keeps its last summary, with one
        warning."""
        try:
            self._look()
            self._failure = None
        except OSError:
            return False
        except Exception as error:  # a record no reader foresaw: never the fronts' end
            failure = describe_error(error)
            if failure != self._failure:
                logger.warning("ipycloud could not summarise the run log %s: %s", self.path,
                               failure)
                self._failure = failure
        return self.summary is not None

    def run(self) -> RunSummary:
        """The run as read at the last look."""
        return self.reader.summary()

    def records_after(self, since: float | None) -> list[Json]:
        """The first records after ``since`` (see ``LogReader.records_after``); none where
        the log can no longer be read."""
        try:
            return self.reader.records_after(since)
        except OSError:
            return []

    def _look(self) -> None:
        status = os.lstat(self.path)
        state = (status.st_ino, status.st_size, status.st_mtime_ns)
        if state != self._state or self.summary is None or self.reader.offset < status.st_size:
            self.reader.read(budget=self.look_bytes, background=True)
            self._state, self.changed_ns = state, status.st_mtime_ns
        elif self.summary["status"] not in LIVE:
            return
        self.summary = self.reader.summary().to_json()
