"""The callback of ``fit`` that writes the run's record (see ``records`` for its lines).

It is an ``ipycloud.Callback`` by its hooks (the protocol sits above this layer, in
``train.callback``), called by ``fit`` like any other.

Each call of ``fit`` in the process that saves checkpoints (rank 0) appends to its run's
log: a ``start``, each logged step, each epoch, checkpoint and event, and the ``end``;
the start also names the log in the user's index of runs. The lines go out through an
``Appender``: the training thread only queues them; storage that fails is told once and
never holds up or breaks the run.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipycloud._version import __version__
from ipycloud.runtime.checkpoint.leases import new_run_id
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.appender import Appender
from ipycloud.runtime.user_warning import warn

if TYPE_CHECKING:
    from ipycloud.runtime.checkpoint.catalog import CheckpointInfo

END_FLUSH_S = 1.0  # how long the end of a run waits for its record to be written
_CONNECTION_FILE = re.compile(r"kernel-(.+)\.json")


def record_run(start: Any) -> RunRecorder | None:
    """The recorder of a run that starts as ``start`` (a ``RunStart``) says; None in a
    process that does not save the run's checkpoints (a rank other than the first)."""
    if not start.main:
        return None
    run = start.run or new_run_id()
    folder = None if start.folder is None else Path(os.path.abspath(start.folder))
    return RunRecorder(run, folder, Appender(records.log_path(folder, run), records.encode))


class RunRecorder:
    """Writes one run's record as ``fit`` tells it what happens."""

    every_step = False  # the logged rows only

    def __init__(self, run: str, folder: Path | None, appender: Appender) -> None:
        self.run, self.folder = run, folder
        self.appender = appender
        self._warned = False

    def on_start(self, start: Any) -> None:
        line = self._write(records.START, {
            "run": self.run, **this_process(),
            "folder": None if self.folder is None else str(self.folder), **start.details,
            "step": start.step, "epoch": start.epoch, "total_steps": start.total_steps,
            "epochs": start.epochs, "max_steps": start.max_steps})
        entry = {"run": self.run, "log": str(self.appender.path), "pid": line["pid"],
                 "host": line["host"], "kernel": line["kernel"], "started": line["t"]}
        self.appender.call(lambda: records.write_index_entry(self.run, entry))
        self.appender.write_soon()  # a run killed in its first moments is still on record

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        self._write(records.STEP, logs, droppable=True)

    def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        self._write(records.EPOCH, logs)

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        self._write(records.CHECKPOINT, {"name": info.name, "step": info.step,
                                         "epoch": info.epoch,
                                         "folder": os.path.abspath(info.directory)})
        self.appender.write_soon()  # the record names the checkpoint a rerun resumes from

    def on_event(self, event: str, message: str) -> None:
        self._write(records.EVENT, {"event": event, "message": message})

    def on_end(self, end: Any) -> None:
        self._write(records.END, {"status": end.status, "reason": end.reason,
                                  "step": end.step, "epoch": end.epoch, "best": end.best})
        self.appender.flush(END_FLUSH_S)  # the process may end right after (a SIGTERM)
        self.appender.close()
        self._tell_failure()

    def _write(self, kind: str, fields: dict[str, Any],
               droppable: bool = False) -> dict[str, Any]:
        line = {"t": round(time.time(), 3), "kind": kind, **fields}
        self.appender.append(line, droppable)
        if self.appender.failure is not None and not self._warned:
            self._tell_failure()
        return line

    def _tell_failure(self) -> None:
        failure = self.appender.failure
        if failure is None or self._warned:
            return
        self._warned = True
        warn(f"ipycloud.fit: the run's record cannot be written to "
             f"{self.appender.path} ({failure.strerror or failure}); training goes "
             "on, and the record's lines are kept in memory and written once it "
             "answers", records.RunRecordWarning)


def this_process() -> dict[str, Any]:
    """Who runs the run: process, host, Jupyter kernel, notebook, platform (with the time
    left in its session), torchrun's restarts, versions."""
    import psutil

    from ipycloud.runtime.machine.platform import detect_platform

    started = psutil.Process().create_time()
    platform = detect_platform()
    limit = platform.session_limit_s
    kernel = kernel_id()
    torch = sys.modules.get("torch")
    return {"pid": os.getpid(), "host": socket.gethostname(), "process_started": started,
            "kernel": kernel, "notebook": _notebook(kernel), "platform": platform.name,
            "session_left_s": None if limit is None else round(limit - (time.time() - started),
                                                               1),
            "restarts": torchrun_restarts(),
            "versions": {"ipycloud": __version__,
                         "torch": getattr(torch, "__version__", None)}}


def torchrun_restarts() -> dict[str, int] | None:
    """How many times torchrun restarted this process's group (``count``) and may at most
    (``max``), from the variables it sets (TORCHELASTIC_RESTART_COUNT and
    TORCHELASTIC_MAX_RESTARTS); None outside torchrun."""
    try:
        return {"count": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
                "max": int(os.environ["TORCHELASTIC_MAX_RESTARTS"])}
    except (KeyError, ValueError):
        return None


def kernel_id(argv: list[str] | None = None) -> str | None:
    """The Jupyter kernel this process is, from its connection file's name
    (``-f .../kernel-<id>.json`` on its command line); None outside a kernel."""
    argv = sys.argv if argv is None else argv
    for index, word in enumerate(argv):
        path = (argv[index + 1] if word == "-f" and index + 1 < len(argv)
                else word.partition("=")[2] if word.startswith(("--f=", "-f=")) else None)
        found = path and _CONNECTION_FILE.fullmatch(os.path.basename(path))
        if found:
            return found.group(1)
    return None


def _notebook(kernel: str | None) -> str | None:
    """The notebook's name as Jupyter gives it to its kernel; outside a kernel, the
    script's."""
    named = os.environ.get("JPY_SESSION_NAME")
    if named:
        return os.path.basename(named)
    script = sys.argv[0] if sys.argv else ""
    return os.path.basename(script) if kernel is None and script.endswith(".py") else None
