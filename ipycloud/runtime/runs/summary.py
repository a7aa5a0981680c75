"""A run as its log tells it: where it stands, how fast it goes, how it ended.

A resumed run's log holds a ``start`` for each call of ``fit``; the steps and epochs past
where a later start resumed were redone by it, so the summary keeps only the redone ones.
The newest start names the process that writes the log now: a run that torchrun restarts
may be written in turn by processes on several hosts. A run without an ``end`` after its
last start is running while its process lives, and lost once it is gone (a SIGKILL, a
machine that went away); a process on another machine cannot be seen, so its run counts
as lost once its log is stale: nothing written for STALE_S, or for STALE_GAPS times the
longest wait between two of its lines where the run writes that seldom. A process that
torchrun may still restart (its start names restarts left) is ``restarting`` rather than
failed, paused or lost while its log is less than STALE_S old: the next start continues it.
"""

from __future__ import annotations

import itertools
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.checkpoint.runs import process_alive
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.best import best_epoch
from ipycloud.runtime.units import format_duration, format_rate

RUNNING, RESTARTING, LOST = "running", "restarting", "lost"  # besides those of an end (RunEnd's)
LIVE = (RUNNING, RESTARTING)  # statuses of a run that may still move
RESTARTABLE = ("failed", "paused")  # the ends torchrun restarts a process after
STALE_S = 600.0  # a run on another machine whose log is this old is lost
STALE_GAPS = 3  # ... or this many times its longest wait between lines, where longer
RATE_ROWS = 6  # the recent step rows the speed is measured over


@dataclass
class RunSummary:
    """One run of ``fit``, from its log (see ``to_json`` for the figures)."""

    id: str
    status: str  # running, restarting, paused, finished, failed, stopped early or lost
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

    @property
    def host(self) -> str | None:
        """The host of the process that writes the run now (its newest start's)."""
        host = self.start.get("host")
        return host if isinstance(host, str) else None

    @property
    def remote(self) -> bool:
        """Whether the run is written on another machine than this one."""
        return self.host is not None and self.host != socket.gethostname()

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON (what the server and ``ipycloud runs --json`` give):
        ``epochs`` is the number of epochs the run is to train, ``events`` and
        ``checkpoints`` are counts (the records themselves come with ``read_run``),
        ``remote`` says whether ``host`` is another machine than the reader's."""
        start = self.start
        return {"id": self.id, "status": self.status, "notebook": start.get("notebook"),
                "host": self.host, "remote": self.remote, "pid": start.get("pid"),
                "kernel": start.get("kernel"), "folder": start.get("folder"),
                "log": str(self.log), "started": self.started, "updated": self.updated,
                "step": self.step, "total_steps": self.total_steps, "epoch": self.epoch,
                "epochs": self.total_epochs, "steps_per_s": _rounded(self.steps_per_s, 3),
                "eta_s": _rounded(self.eta_s, 1),
                "session_left_s": _rounded(self.session_left_s, 1),
                "last_loss": self.last_loss, "best": self.best, "reason": self.reason,
                "events": len(self.events), "checkpoints": len(self.checkpoints),
                "device": start.get("device"), "model": start.get("model")}

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"run {self.id}: {progress_line(self)}")


def summarize(log: Path, lines: list[dict[str, Any]], now: float | None = None) -> RunSummary:
    """The summary of the run whose log at ``log`` holds ``lines`` (``now``: the time to
    judge a live run by; default the clock)."""
    now = time.time() if now is None else now
    first: dict[str, Any] | None = None
    start: dict[str, Any] = {}
    end: dict[str, Any] | None = None
    newest = 0  # where the newest start is among the lines
    kept: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (
        records.STEP, records.EPOCH, records.EVENT, records.CHECKPOINT)}
    for index, line in enumerate(lines):
        kind = line["kind"]
        if kind == records.START:
            first, start, end, newest = first or line, line, None, index
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
    status = (_ended_status(start, end, now) if end is not None
              else _live_status(start, lines[newest:], now))
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


def _live_status(start: dict[str, Any], written: list[dict[str, Any]], now: float) -> str:
    """A run without an end, whose newest start and the lines after it are ``written``:
    running while its process lives, else restarting or lost."""
    pid, host = start.get("pid"), start.get("host")
    if not isinstance(pid, int) or not isinstance(host, str):
        return LOST
    quiet = now - written[-1]["t"]  # how long nothing was written
    if host != socket.gethostname():
        return RUNNING if quiet < _stale_after(written) else LOST
    started = start.get("process_started")
    if process_alive(pid, host, started if isinstance(started, int | float) else None):
        return RUNNING
    return RESTARTING if _restarts_left(start) and quiet < STALE_S else LOST


def _ended_status(start: dict[str, Any], end: dict[str, Any], now: float) -> str:
    """The status of a run whose last start has an end: the end's, unless torchrun may
    still restart its process."""
    if end["status"] in RESTARTABLE and _restarts_left(start) and now - end["t"] < STALE_S:
        return RESTARTING
    return str(end["status"])


def _stale_after(written: list[dict[str, Any]]) -> float:
    """How long a writer on another machine may write nothing before its run is lost:
    STALE_S, or STALE_GAPS times its longest wait between two lines where longer."""
    gaps = [later["t"] - earlier["t"] for earlier, later in itertools.pairwise(written)]
    return max([STALE_S, *(STALE_GAPS * gap for gap in gaps)])


def _restarts_left(start: dict[str, Any]) -> bool:
    """Whether the process the start names runs under torchrun with restarts left."""
    restarts = start.get("restarts")
    if not isinstance(restarts, dict):
        return False
    count, most = restarts.get("count"), restarts.get("max")
    return isinstance(count, int) and isinstance(most, int) and count < most


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


def progress_line(run: RunSummary) -> str:
    """Where ``run`` stands: ``running on node-2 · step 1,200/5,000 (24%) · epoch 3/10 ·
    loss 0.5321 · 4.1 steps/s · ETA 15 min``; its best metric, why it ended, and when a
    lost one wrote last."""
    where = f"{run.status} on {run.host}" if run.host else run.status
    parts = [where, _steps(run)]
    if run.total_epochs:
        # The record counts epochs done; people count the one under way, from 1.
        parts.append(f"epoch {min(run.epoch + 1, run.total_epochs)}/{run.total_epochs}")
    if isinstance(run.last_loss, int | float):
        parts.append(f"loss {run.last_loss:.4g}")
    if run.status == RUNNING and run.steps_per_s:
        parts.append(f"{format_rate(run.steps_per_s)} steps/s")
    if run.eta_s is not None:
        parts.append(f"ETA {format_duration(run.eta_s)}")
    best = run.best
    if best and isinstance(best.get("value"), int | float):
        epoch = best.get("epoch")
        at = f" (epoch {epoch + 1})" if isinstance(epoch, int) else ""
        parts.append(f"best {best.get('metric')} {best['value']:.4g}{at}")
    if run.reason:
        parts.append(run.reason)
    if run.status == LOST and run.updated is not None:
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.updated))
        parts.append(f"nothing recorded since {written}")
    return " · ".join(parts)


def _steps(run: RunSummary) -> str:
    if not run.total_steps:
        return f"step {run.step:,}"
    share = f" ({100 * run.step / run.total_steps:.0f}%)" if run.step < run.total_steps else ""
    return f"step {run.step:,}/{run.total_steps:,}{share}"
