"""A run as its log tells it: where it stands, how fast it goes, how it ended.

A resumed run's log holds a ``start`` for each call of ``fit``; the steps and epochs past
where a later start resumed were redone by it, so the summary keeps only the redone ones.
A run without an ``end`` after its last start is running while its process lives, and
lost once it is gone (a SIGKILL, a machine that went away); a process on another machine
cannot be seen, so its run counts as lost once its log is STALE_S old.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.checkpoint.runs import process_alive
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.best import best_epoch

RUNNING, LOST = "running", "lost"  # besides the statuses of an end (RunEnd's)
STALE_S = 600.0  # a run on another machine whose log is this old is lost
RATE_ROWS = 6  # the recent step rows the speed is measured over


@dataclass
class RunSummary:
    """One run of ``fit``, from its log (see ``to_json`` for the figures)."""

    id: str
    status: str  # running, paused, finished, failed, stopped early or lost
    log: Path
    started: float | None  # the first start's time
    updated: float | None  # the last record's time
    step: int
    epoch: int
    total_steps: int | None
    total_epochs: int | None
    steps_per_s: float | None  # over the recent steps
    eta_s: float | None  # while running
    session_left_s: float | None  # while running, where the platform has a session limit
    last_loss: float | None
    best: dict[str, Any] | None  # {"metric", "value", "epoch"}
    reason: str | None  # why it ended, as the end says
    start: dict[str, Any] = field(default_factory=dict, repr=False)  # the last start
    steps: list[dict[str, Any]] = field(default_factory=list, repr=False)
    epochs: list[dict[str, Any]] = field(default_factory=list, repr=False)
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)
    checkpoints: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON (what the server and ``ipycloud runs --json`` give):
        ``epochs`` is the number of epochs the run is to train, ``events`` and
        ``checkpoints`` are counts (the records themselves come with ``read_run``)."""
        start = self.start
        return {"id": self.id, "status": self.status, "notebook": start.get("notebook"),
                "host": start.get("host"), "pid": start.get("pid"),
                "kernel": start.get("kernel"), "folder": start.get("folder"),
                "log": str(self.log), "started": self.started, "updated": self.updated,
                "step": self.step, "total_steps": self.total_steps, "epoch": self.epoch,
                "epochs": self.total_epochs, "steps_per_s": _rounded(self.steps_per_s, 3),
                "eta_s": _rounded(self.eta_s, 1),
                "session_left_s": _rounded(self.session_left_s, 1),
                "last_loss": self.last_loss, "best": self.best, "reason": self.reason,
                "events": len(self.events), "checkpoints": len(self.checkpoints),
                "device": start.get("device"), "model": start.get("model")}


def summarize(log: Path, lines: list[dict[str, Any]], now: float | None = None) -> RunSummary:
    """The summary of the run whose log at ``log`` holds ``lines`` (``now``: the time to
    judge a live run by; default the clock)."""
    now = time.time() if now is None else now
    first: dict[str, Any] | None = None
    start: dict[str, Any] = {}
    end: dict[str, Any] | None = None
    kept: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (
        records.STEP, records.EPOCH, records.EVENT, records.CHECKPOINT)}
    for line in lines:
        kind = line["kind"]
        if kind == records.START:
            first, start, end = first or line, line, None
            kept[records.STEP] = [row for row in kept[records.STEP]
                                  if row["step"] <= line["step"]]
            kept[records.EPOCH] = [logs for logs in kept[records.EPOCH]
                                   if logs["epoch"] < line["epoch"]]
        elif kind == records.END:
            end = line
        else:
            kept[kind].append(line)
    steps, epochs = kept[records.STEP], kept[records.EPOCH]
    since_start = [row for row in steps if row["step"] > start.get("step", -1)]
    status = end["status"] if end is not None else _live_status(start, lines, now)
    step, epoch = _position(start, since_start, epochs, end)
    speed = _speed(since_start)
    total_steps = start.get("total_steps")
    running = status == RUNNING
    left = start.get("session_left_s")
    return RunSummary(
        id=log.stem, status=status, log=log,
        started=first["t"] if first else None, updated=lines[-1]["t"] if lines else None,
        step=step, epoch=epoch, total_steps=total_steps, total_epochs=start.get("epochs"),
        steps_per_s=speed,
        eta_s=max(0.0, (total_steps - step) / speed)
        if running and speed and isinstance(total_steps, int) else None,
        session_left_s=left - (now - start["t"])
        if running and isinstance(left, int | float) else None,
        last_loss=steps[-1].get("loss") if steps else None,
        best=_best(start, epochs, end), reason=end.get("reason") if end else None,
        start=start, steps=steps, epochs=epochs, events=kept[records.EVENT],
        checkpoints=kept[records.CHECKPOINT])


def _live_status(start: dict[str, Any], lines: list[dict[str, Any]], now: float) -> str:
    """A run without an end: running while its process lives, else lost."""
    pid, host = start.get("pid"), start.get("host")
    if not isinstance(pid, int) or not isinstance(host, str):
        return LOST
    if host != socket.gethostname():
        return RUNNING if now - lines[-1]["t"] < STALE_S else LOST
    started = start.get("process_started")
    alive = process_alive(pid, host, started if isinstance(started, int | float) else None)
    return RUNNING if alive else LOST


def _position(start: dict[str, Any], since_start: list[dict[str, Any]],
              epochs: list[dict[str, Any]], end: dict[str, Any] | None) -> tuple[int, int]:
    """The step and epoch (epochs done) the run reached."""
    if end is not None and isinstance(end.get("step"), int) and isinstance(end.get("epoch"), int):
        return end["step"], end["epoch"]
    step = since_start[-1]["step"] if since_start else start.get("step", 0)
    epoch = max([start.get("epoch", 0)] + [logs["epoch"] + 1 for logs in epochs]
                + [row["epoch"] for row in since_start if isinstance(row.get("epoch"), int)])
    return step, epoch


def _speed(rows: list[dict[str, Any]]) -> float | None:
    """Optimizer steps a second over the recent rows of this start (the time between rows
    counts, validation included), or the one row's own figure."""
    recent = rows[-RATE_ROWS:]
    if len(recent) >= 2 and recent[-1]["t"] > recent[0]["t"]:
        return (recent[-1]["step"] - recent[0]["step"]) / (recent[-1]["t"] - recent[0]["t"])
    speed = recent[-1].get("steps_per_s") if recent else None
    return float(speed) if isinstance(speed, int | float) and speed > 0 else None


def _best(start: dict[str, Any], epochs: list[dict[str, Any]],
          end: dict[str, Any] | None) -> dict[str, Any] | None:
    """The end's best; before the end, the best epoch so far by the metric the run watches."""
    if end is not None and "best" in end:
        best = end["best"]
        return best if isinstance(best, dict) else None
    watch = start.get("watch")
    if not isinstance(watch, dict):
        return None
    return best_epoch(epochs, str(watch.get("metric")), str(watch.get("mode")))


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
