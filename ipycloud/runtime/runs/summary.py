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

import math
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.checkpoint.leases import process_alive
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.best import best_epoch
from ipycloud.runtime.units import finite_number, format_duration, format_rate
from ipycloud.runtime.untrusted import is_count, is_unix_time, strict

RUNNING, RESTARTING, LOST = "running", "restarting", "lost"  # besides those of an end (RunEnd's)
LIVE = (RUNNING, RESTARTING)  # statuses of a run that may still move
RESTARTABLE = ("failed", "paused")  # the ends torchrun restarts a process after
STALE_S = 600.0  # a run on another machine whose log is this old is lost
STALE_GAPS = 3  # ... or this many times its longest wait between lines, where longer
RATE_ROWS = 6  # the recent step rows the speed is measured over
MAX_STEP_ROWS = 2000  # step rows a summary keeps for the curves, at most
MAX_EPOCH_ROWS = 2000  # and epoch rows
KEPT_NOTES = 50  # events and checkpoints a summary keeps, the last ones
ROW_FIELDS = 48  # fields of a record a summary keeps, the first plain ones
ROW_TEXT = 200  # characters of a text field kept


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
    event_count: int = 0  # events recorded (``events`` holds the last KEPT_NOTES)
    checkpoint_count: int = 0

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
        return strict({"id": self.id, "status": self.status, "notebook": _text(start, "notebook"),
                "host": self.host, "remote": self.remote, "pid": _count(start.get("pid")),
                "kernel": _text(start, "kernel"), "folder": _text(start, "folder"),
                "log": str(self.log), "started": self.started, "updated": self.updated,
                "step": self.step, "total_steps": self.total_steps, "epoch": self.epoch,
                "epochs": self.total_epochs, "steps_per_s": _rounded(self.steps_per_s, 3),
                "eta_s": _rounded(self.eta_s, 1),
                "session_left_s": _rounded(self.session_left_s, 1),
                "last_loss": self.last_loss, "best": self.best, "reason": self.reason,
                "events": self.event_count, "checkpoints": self.checkpoint_count,
                "device": _text(start, "device"), "model": _text(start, "model")})

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"run {self.id}: {progress_line(self)}")


def summarize(log: Path, lines: Iterable[dict[str, Any]],
              now: float | None = None) -> RunSummary:
    """The summary of the run whose log at ``log`` holds ``lines`` (``now``: the time to
    judge a live run by; default the clock)."""
    state = RunState()
    for line in lines:
        state.add(line)
    return state.summary(log, now)


class RunState:
    """A run summed up one record at a time (``add``), holding only what its summary and
    curves need, however long the log: the newest start, the end, the last RATE_ROWS step
    rows of the newest start, and at most MAX_STEP_ROWS step rows and MAX_EPOCH_ROWS epoch
    rows for the curves (each halved, every other one dropped, the newest kept, when full),
    the last KEPT_NOTES events and checkpoints (and their counts), each row of plain
    values only (at most ROW_FIELDS)."""

    def __init__(self) -> None:
        self.count = 0  # records added
        self.first_t: float | None = None  # the first start's time
        self.updated: float | None = None  # the last record's time
        self.start: dict[str, Any] = {}  # the newest
        self.end: dict[str, Any] | None = None  # after the newest start
        self.steps = _Rows(MAX_STEP_ROWS)
        self.epochs = _Rows(MAX_EPOCH_ROWS)
        self.recent: deque[dict[str, Any]] = deque(maxlen=RATE_ROWS)  # of the newest start
        self.epoch = 0  # epochs done, as the newest start and what came after it say
        self.longest_gap = 0.0  # between two lines since the newest start
        self.events: deque[dict[str, Any]] = deque(maxlen=KEPT_NOTES)
        self.checkpoints: deque[dict[str, Any]] = deque(maxlen=KEPT_NOTES)
        self.event_count = self.checkpoint_count = 0

    def add(self, line: dict[str, Any]) -> None:
        """Take in one record (as ``records.parse_record`` gives it)."""
        kind, t = line["kind"], line["t"]
        if self.start and self.updated is not None:
            self.longest_gap = max(self.longest_gap, t - self.updated)
        self.count += 1
        self.updated = t
        if kind == records.START:
            self._start(line)
        elif kind == records.END:
            self.end = line
        elif kind == records.STEP:
            row = plain_row(line)
            self.steps.add(row)
            if row["step"] > self.start.get("step", -1):
                self.recent.append(row)
                if is_count(row.get("epoch")):
                    self.epoch = max(self.epoch, row["epoch"])
        elif kind == records.EPOCH:
            self.epochs.add(plain_row(line))
            self.epoch = max(self.epoch, line["epoch"] + 1)
        elif kind == records.EVENT:
            self.events.append(plain_row(line))
            self.event_count += 1
        else:
            self.checkpoints.append(plain_row(line))
            self.checkpoint_count += 1

    def _start(self, line: dict[str, Any]) -> None:
        """A call of ``fit`` began (a resume redoes the steps and epochs after its own)."""
        self.first_t = line["t"] if self.first_t is None else self.first_t
        self.start, self.end = line, None
        self.steps.keep(lambda row: row["step"] <= line["step"])
        self.epochs.keep(lambda logs: logs["epoch"] < line["epoch"])
        self.recent.clear()
        self.epoch, self.longest_gap = line["epoch"], 0.0

    def summary(self, log: Path, now: float | None = None) -> RunSummary:
        """The run's summary (``now``: the time to judge a live run by; default the
        clock)."""
        now = time.time() if now is None else now
        start, end, steps = self.start, self.end, self.steps.rows
        status = _ended_status(start, end, now) if end is not None else self._live_status(now)
        step, epoch = self._position()
        speed = _speed(list(self.recent))
        total_steps = _count(start.get("total_steps"))
        running = status == RUNNING
        left = start.get("session_left_s")
        eta = (total_steps - step) / speed if running and speed and total_steps else None
        reason = end.get("reason") if end else None
        return RunSummary(
            id=log.stem, status=status, log=log, started=self.first_t, updated=self.updated,
            step=step, epoch=epoch, total_steps=total_steps,
            total_epochs=_count(start.get("epochs")), steps_per_s=speed,
            eta_s=max(0.0, eta) if eta is not None and math.isfinite(eta) else None,
            session_left_s=left - (now - start["t"])
            if running and isinstance(left, int | float) else None,
            last_loss=_number(steps[-1].get("loss")) if steps else None,
            best=self._best(), reason=reason if isinstance(reason, str) else None,
            start=start, steps=list(steps), epochs=list(self.epochs.rows),
            events=list(self.events), checkpoints=list(self.checkpoints),
            event_count=self.event_count, checkpoint_count=self.checkpoint_count)

    def records(self) -> list[dict[str, Any]]:
        """The records kept: the newest start, the step and epoch rows, the last events
        and checkpoints, the end; in time order."""
        kept = [*([self.start] if self.start else []), *self.steps.rows, *self.epochs.rows,
                *self.events, *self.checkpoints, *([self.end] if self.end else [])]
        return sorted(kept, key=lambda record: record["t"])

    def _live_status(self, now: float) -> str:
        """A run without an end after its newest start: running while its process lives,
        else restarting or lost."""
        start = self.start
        pid, host = _count(start.get("pid")), start.get("host")
        if pid is None or not isinstance(host, str) or self.updated is None:
            return LOST
        quiet = now - self.updated  # how long nothing was written
        if host != socket.gethostname():
            return RUNNING if quiet < max(STALE_S, STALE_GAPS * self.longest_gap) else LOST
        started = start.get("process_started")
        if process_alive(pid, host, started if is_unix_time(started) else None):
            return RUNNING
        return RESTARTING if _restarts_left(start) and quiet < STALE_S else LOST

    def _position(self) -> tuple[int, int]:
        """The step and epoch (epochs done) the run reached."""
        end = self.end
        if end is not None and is_count(end.get("step")) and is_count(end.get("epoch")):
            return end["step"], end["epoch"]
        step = self.recent[-1]["step"] if self.recent else self.start.get("step", 0)
        return step, self.epoch

    def _best(self) -> dict[str, Any] | None:
        """The end's best; before the end, the best epoch so far by the metric the run
        watches."""
        if self.end is not None and "best" in self.end:
            return _checked_best(self.end["best"])
        watch = self.start.get("watch")
        if not isinstance(watch, dict):
            return None
        return best_epoch(self.epochs.rows, str(watch.get("metric")), str(watch.get("mode")))


class _Rows:
    """At most ``most`` rows, in order, evenly spread over those added: when full, every
    other one is dropped and from then on only every ``stride``-th row added is kept; the
    newest row is always there."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._kept: list[dict[str, Any]] = []
        self._newest: dict[str, Any] | None = None  # the newest, where not kept
        self._stride = 1
        self._since = 0  # rows added since the last one kept

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self._kept if self._newest is None else [*self._kept, self._newest]

    def add(self, row: dict[str, Any]) -> None:
        self._since += 1
        if self._since < self._stride:
            self._newest = row
            return
        self._kept.append(row)
        self._newest, self._since = None, 0
        if len(self._kept) >= self.most:
            self._kept, self._stride = self._kept[::2], self._stride * 2

    def keep(self, wanted: Callable[[dict[str, Any]], bool]) -> None:
        """Keep only the ``wanted`` rows."""
        self._kept = [row for row in self._kept if wanted(row)]
        if self._newest is not None and not wanted(self._newest):
            self._newest = None


def plain_row(line: dict[str, Any]) -> dict[str, Any]:
    """What a summary keeps of a record: its time, kind, step and epoch, and its first
    other fields of plain values (numbers, text of at most ROW_TEXT characters, true or
    false, null), ROW_FIELDS in all."""
    row = {key: line[key] for key in _ROW_FIRST if key in line}
    for key, value in line.items():
        if isinstance(value, str):
            row[key] = value[:ROW_TEXT]
        elif value is None or isinstance(value, int | float):
            row[key] = value
        if len(row) == ROW_FIELDS:
            break
    return row


_ROW_FIRST = ("t", "kind", "step", "epoch")


def _count(value: Any) -> int | None:
    return value if is_count(value) else None


def _text(record: dict[str, Any], name: str) -> str | None:
    value = record.get(name)
    return value if isinstance(value, str) else None


def _checked_best(best: Any) -> dict[str, Any] | None:
    """An end's best as the summary gives it: a metric's name, a finite value and the
    epoch (or None); None where the log's is not one."""
    if not isinstance(best, dict) or not isinstance(best.get("metric"), str):
        return None
    value, epoch = best.get("value"), best.get("epoch")
    if not finite_number(value):
        return None
    return {"metric": best["metric"], "value": value, "epoch": _count(epoch)}


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _ended_status(start: dict[str, Any], end: dict[str, Any], now: float) -> str:
    """The status of a run whose last start has an end: the end's, unless torchrun may
    still restart its process."""
    if end["status"] in RESTARTABLE and _restarts_left(start) and now - end["t"] < STALE_S:
        return RESTARTING
    return str(end["status"])


def _restarts_left(start: dict[str, Any]) -> bool:
    """Whether the process the start names runs under torchrun with restarts left."""
    restarts = start.get("restarts")
    if not isinstance(restarts, dict):
        return False
    count, most = restarts.get("count"), restarts.get("max")
    return isinstance(count, int) and isinstance(most, int) and count < most


def _speed(rows: list[dict[str, Any]]) -> float | None:
    """Optimizer steps a second over the recent rows of this start (the time between rows
    counts, validation included), or the one row's own figure."""
    recent = rows[-RATE_ROWS:]
    if len(recent) >= 2 and recent[-1]["t"] > recent[0]["t"]:
        return (recent[-1]["step"] - recent[0]["step"]) / (recent[-1]["t"] - recent[0]["t"])
    speed = recent[-1].get("steps_per_s") if recent else None
    return float(speed) if isinstance(speed, int | float) and speed > 0 else None


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
