"""The runs of ``fit`` in this process, for the ``api/runs`` routes of the dashboard page the
kernel serves: read from their run records, answered as the Jupyter server's routes of the
same names answer them (``ipycloud/server/README.md``), less the runs of other processes."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from ipycloud.runtime.runs import RunSummary, UnknownRunError, read_run, runs


class NoSuchRun(LookupError):
    """No run of this process has that id."""


def process_runs() -> list[RunSummary]:
    """The runs started by this process on this machine, newest first."""
    pid, host = os.getpid(), socket.gethostname()
    return [summary for summary in runs()
            if summary.start.get("pid") == pid and summary.start.get("host") == host]


def runs_answer() -> bytes:
    """The JSON of ``api/runs``: ``{"runs": [summary, ...]}``."""
    return json.dumps({"runs": [summary.to_json() for summary in process_runs()]}).encode()


def run_answer(run_id: str, since: float | None) -> bytes:
    """The JSON of ``api/runs/<id>``: ``{"run": summary, "records": [records after
    since]}``; NoSuchRun where no run of this process has ``run_id``."""
    if run_id not in {summary.id for summary in process_runs()}:
        raise NoSuchRun(f"no run {run_id!r} in this kernel: api/runs lists its runs")
    try:
        summary, records = read_run(run_id, since)
    except UnknownRunError as error:  # its log went away since
        raise NoSuchRun(str(error)) from None
    body: dict[str, Any] = {"run": summary.to_json(), "records": records}
    return json.dumps(body).encode()
