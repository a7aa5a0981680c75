"""A still of the dashboard, for a notebook saved with a live view in it: the machine's
resources at one reading and this process's runs of ``fit``, as HTML that JupyterLab shows
without a kernel, trusted or not (tables and text only: no script, iframe or style sheet,
which its sanitizer removes from an untrusted notebook), and as text."""

from __future__ import annotations

import html
import time
from typing import Any

from ipycloud.runtime.monitor.page_runs import process_runs
from ipycloud.runtime.monitor.samples import Sample
from ipycloud.runtime.monitor.textview import resource_table
from ipycloud.runtime.runs import RunsTable
from ipycloud.runtime.tables import aligned_lines, html_table

SNAPSHOT_CLASS = "ipycloud-snapshot"  # the still's outer element


class Snapshot:
    """The dashboard as it stood at ``sample``, with the runs of this process."""

    def __init__(self, sample: Sample, note: str) -> None:
        self.sample = sample
        self.note = note  # why it is a still: "the live view ended", ...
        self.runs = RunsTable(process_runs().summaries(), "in this kernel")

    def title(self) -> str:
        clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.sample.time))
        return f"ipycloud dashboard at {clock} ({self.note})"

    def html(self) -> str:
        runs = self.runs.html() if self.runs.summaries else ""
        return (f'<div class="{SNAPSHOT_CLASS}"><p><b>{html.escape(self.title())}</b></p>'
                f"{runs}{html_table(resource_table(self.sample))}</div>")

    def __str__(self) -> str:
        runs = [str(self.runs)] if self.runs.summaries else []
        return "\n".join([self.title(), *runs, *aligned_lines(*resource_table(self.sample))])

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/html": self.html(), "text/plain": str(self)}
