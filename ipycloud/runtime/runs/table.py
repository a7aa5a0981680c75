"""Runs as a table: aligned text for terminals (``ipycloud runs``), HTML for notebooks."""

from __future__ import annotations

import html
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs.records import RECORD_FOLDER
from ipycloud.runtime.runs.summary import RunSummary
from ipycloud.runtime.tables import Table, aligned_lines, html_table
from ipycloud.runtime.units import counted, format_duration, format_rate


class RunsTable:
    """Runs, newest first, one row each: status, progress, speed, time left, best metric;
    the host each is written on, where one is another machine (a cluster's node); the
    checkpoint folder of each, relative to ``base``, where a run lies in a subfolder of
    the folder listed."""

    HEADERS = ("run", "status", "notebook", "step", "epoch", "loss", "steps/s", "eta",
               "best", "events", "updated")
    HOST_AFTER = HEADERS.index("notebook")  # where the host column goes, when shown

    def __init__(self, summaries: Sequence[RunSummary], where: str,
                 base: Path | None = None) -> None:
        self.summaries = list(summaries)
        self.where = where  # what the runs are of: a folder, or "this machine"
        self.base = None if base is None else Path(os.path.abspath(base))

    def table(self) -> Table:
        rows = [(run.id, run.status, _text(run.start.get("notebook")),
                 _out_of(run.step, run.total_steps), _out_of(run.epoch, run.total_epochs),
                 "" if run.last_loss is None else f"{run.last_loss:.4g}",
                 "" if run.steps_per_s is None else format_rate(run.steps_per_s),
                 "" if run.eta_s is None else format_duration(run.eta_s),
                 _best(run.best), str(run.event_count) if run.event_count else "",
                 _when(run.updated))
                for run in self.summaries]
        table: Table = (self.HEADERS, rows)
        if any(run.remote for run in self.summaries):
            table = _with_column(table, "host", [run.host or "" for run in self.summaries])
        folders = [self._folder(run) for run in self.summaries]
        if any(folders):
            table = _with_column(table, "folder", folders)
        return table

    def _folder(self, run: RunSummary) -> str:
        """The run's checkpoint folder relative to ``base``; "" where it is ``base``."""
        logs = run.log.parent
        folder = logs.parent if logs.name == RECORD_FOLDER else logs
        if self.base is None or folder == self.base or not folder.is_relative_to(self.base):
            return ""
        return str(folder.relative_to(self.base))

    def title(self) -> str:
        where = self.where
        if self.base is not None and any(map(self._folder, self.summaries)):
            where = f"under {self.base}, in its subfolders"
        if not self.summaries:
            return f"no runs {where}"
        return f"{counted(len(self.summaries), 'run')} {where}"

    def __str__(self) -> str:
        rows = aligned_lines(*self.table()) if self.summaries else []
        return "\n".join([self.title(), *rows])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def html(self) -> str:
        """The title and, when there are runs, their table, as HTML."""
        table = html_table(self.table()) if self.summaries else ""
        return f"<p>{html.escape(self.title())}</p>" + table

    def _repr_html_(self) -> str:
        return self.html()


def _with_column(table: Table, name: str, values: list[str]) -> Table:
    """``table`` with the column ``name`` of ``values`` after the notebook's."""
    headers, rows = table
    at = RunsTable.HOST_AFTER + 1
    return ((*headers[:at], name, *headers[at:]),
            [(*row[:at], value, *row[at:]) for row, value in zip(rows, values, strict=True)])


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _out_of(done: int, total: int | None) -> str:
    return str(done) if total is None else f"{done}/{total}"


def _best(best: dict[str, Any] | None) -> str:
    if not best or not isinstance(best.get("value"), int | float):
        return ""
    return f"{best.get('metric')} {best['value']:.4g} (epoch {best.get('epoch')})"


def _when(unix_time: float | None) -> str:
    return "" if unix_time is None else time.strftime("%Y-%m-%d %H:%M:%S",
                                                       time.localtime(unix_time))
