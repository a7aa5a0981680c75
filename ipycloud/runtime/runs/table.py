"""Runs as a table: aligned text for terminals (``ipycloud runs``), HTML for notebooks."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import Any

from ipycloud.runtime.runs.summary import RunSummary
from ipycloud.runtime.tables import Table, aligned_lines, html_table
from ipycloud.runtime.units import counted, format_duration, format_rate


class RunsTable:
    """Runs, newest first, one row each: status, progress, speed, time left, best metric;
    the host each is written on, where one is another machine (a cluster's node)."""

    HEADERS = ("run", "status", "notebook", "step", "epoch", "loss", "steps/s", "eta",
               "best", "events", "updated")
    HOST_AFTER = HEADERS.index("notebook")  # where the host column goes, when shown

    def __init__(self, summaries: Sequence[RunSummary], where: str) -> None:
        self.summaries = list(summaries)
        self.where = where  # what the runs are of: a folder, or "this machine"

    def table(self) -> Table:
        rows = [(run.id, run.status, run.start.get("notebook") or "",
                 _out_of(run.step, run.total_steps), _out_of(run.epoch, run.total_epochs),
                 "" if run.last_loss is None else f"{run.last_loss:.4g}",
                 "" if run.steps_per_s is None else format_rate(run.steps_per_s),
                 "" if run.eta_s is None else format_duration(run.eta_s),
                 _best(run.best), str(len(run.events)) if run.events else "",
                 _when(run.updated))
                for run in self.summaries]
        if not any(run.remote for run in self.summaries):
            return self.HEADERS, rows
        at = self.HOST_AFTER + 1
        return ((*self.HEADERS[:at], "host", *self.HEADERS[at:]),
                [(*row[:at], run.host or "", *row[at:])
                 for row, run in zip(rows, self.summaries, strict=True)])

    def title(self) -> str:
        if not self.summaries:
            return f"no runs {self.where}"
        return f"{counted(len(self.summaries), 'run')} {self.where}"

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


def _out_of(done: int, total: int | None) -> str:
    return str(done) if total is None else f"{done}/{total}"


def _best(best: dict[str, Any] | None) -> str:
    if not best or not isinstance(best.get("value"), int | float):
        return ""
    return f"{best.get('metric')} {best['value']:.4g} (epoch {best.get('epoch')})"


def _when(unix_time: float | None) -> str:
    return "" if unix_time is None else time.strftime("%Y-%m-%d %H:%M:%S",
                                                       time.localtime(unix_time))
