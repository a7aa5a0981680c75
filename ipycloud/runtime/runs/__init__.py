"""Run records: what every run of ``fit`` did, on disk beside its checkpoints, read back as
summaries (status, progress, ETA, best metric) by the Python API, the terminal, the kernel's
page and the Jupyter server.

``records`` (where logs lie, their lines, the index of runs), ``summary`` (a run from its
lines, in bounded memory), ``log_reader`` (a log read as it grows, whoever wrote it),
``reading`` (``runs`` and ``read_run``), ``table`` (runs as a table), ``best`` (the
best epoch by a metric); ``polled_logs`` (logs followed by the fronts that poll them),
``run_watch`` (one run's log looked at as it grows) and ``follow_run`` (a run followed until it
ends, wherever it trains, shown by a view); the writing side: ``appender`` (lines appended
by a thread of their own) and ``recorder`` (the follower of ``fit`` that writes the
record).
"""

from ipycloud.runtime.runs.reading import UnknownRunError, read_run, runs
from ipycloud.runtime.runs.records import RunRecordWarning
from ipycloud.runtime.runs.summary import RunSummary
from ipycloud.runtime.runs.table import RunsTable

__all__ = ["RunRecordWarning", "RunSummary", "RunsTable", "UnknownRunError", "read_run",
           "runs"]
