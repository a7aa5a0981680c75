"""``ipycloud.follow``: a run of ``fit`` followed from its record, wherever it trains (a
cluster writing into a bucket this notebook mounts), shown as ``fit`` shows its own.

In a Jupyter kernel's main thread the run's progress line and the live curves ``fit``
draws are one output of the cell, redrawn in place from that thread at most once every
``INTERVAL_S`` seconds while the record grows; elsewhere (a terminal, a script, another
thread) the runtime's progress lines are printed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ipycloud.notebook.curves import INTERVAL_S, DisplayArea, Screen
from ipycloud.runtime.kernel import running_kernel
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.follow_run import follow_run
from ipycloud.runtime.runs.run_watch import Change
from ipycloud.runtime.runs.summary import LIVE, RunSummary, progress_line
from ipycloud.runtime.train.curves import TrainingCurves


def follow(folder: str | os.PathLike[str], run: str | None = None) -> RunSummary:
    """Follow a run of ``fit`` from its record in the checkpoint ``folder`` (a bucket
    mount, a synced copy, Drive) until it ends: the newest run there (the first
    ``ipycloud.runs(folder)`` lists), or the one whose id is ``run``.

    In a notebook the cell shows the run's progress line (status, the host it trains on
    now, step, epoch, loss, speed, ETA) over the same live curves ``fit`` draws; elsewhere
    a progress line is printed now and then. A torchrun restart is followed through. The
    Stop button (Ctrl-C) stops following, not the run. JupyterLab's Runs section lists
    the run as one of this notebook's. Returns the run's summary as it ended.

    Example::

        ipycloud.follow("/mnt/bucket/ck")            # the newest run recorded there
        ipycloud.follow("/mnt/bucket/ck", run="71307ad603c2")
    """
    in_notebook = (running_kernel() is not None
                   and threading.current_thread() is threading.main_thread())
    return follow_run(folder, run, view=FollowedCurves(DisplayArea()) if in_notebook else None)


class FollowedCurves:
    """A followed run on ``screen``: its progress line over its curves, redrawn when they
    changed, at most once every ``interval`` seconds of ``clock`` (monotonic), and once
    more as the run ends."""

    def __init__(self, screen: Screen, clock: Callable[[], float] = time.monotonic,
                 interval: float = INTERVAL_S) -> None:
        self.screen, self.clock, self.interval = screen, clock, interval
        self.curves = TrainingCurves()
        self._notes: dict[str, str] = {}  # the last checkpoint and the last event
        self._caption = ""
        self._changed = False  # since the last drawing
        self._drawn_at: float | None = None

    def show(self, run: RunSummary, change: Change) -> None:
        if change.renewed:  # the steps a resume redid are gone from the summary's
            self.curves = TrainingCurves.of(run.steps, run.epochs)
        for line in change.appended:
            self._add(line, change.renewed)
        ended = run.status not in LIVE
        if ended:
            self._notes.pop("event", None)  # the progress line says why it ended
        caption = " · ".join([f"run {run.id}: {progress_line(run)}", *self._notes.values()])
        self._changed = self._changed or bool(change.appended) or caption != self._caption
        self._caption = caption
        due = self._drawn_at is None or self.clock() - self._drawn_at >= self.interval
        if self._changed and (due or ended):
            self._drawn_at, self._changed = self.clock(), False
            self.screen.show(self.curves.html(caption))

    def say(self, line: str) -> None:
        print(line, flush=True)

    def _add(self, line: dict[str, object], drawn: bool) -> None:
        """Take in one record; ``drawn``: its step or epoch is in the curves already."""
        kind = line["kind"]
        if kind == records.STEP and not drawn:
            self.curves.add_step(line)
        elif kind == records.EPOCH and not drawn:
            self.curves.add_epoch(line)
        elif kind == records.CHECKPOINT and isinstance(line.get("step"), int):
            self._notes["checkpoint"] = f"checkpoint at step {line['step']:,}"
        elif kind == records.EVENT:
            self._notes["event"] = str(line.get("message"))
