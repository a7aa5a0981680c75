"""Live training curves: ``fit``'s loss, learning rate and validation metrics under its
progress bar, as inline SVG redrawn in place.

A callback of the run (``ipycloud.runtime.train.callback``) feeds the runtime's
TrainingCurves and redraws them at most once every ``INTERVAL_S`` seconds of the run, and
once more however the run ends. It draws from the thread that runs ``fit``, and only
when that is the kernel's main thread: Colab renders no output sent from other threads.
Outside a Jupyter kernel (a terminal IPython, a script) it never starts.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ipycloud.runtime.train.callback import Callback, RunEnd, RunStart
from ipycloud.runtime.train.curves import TrainingCurves
from ipycloud.runtime.units import format_rate

if TYPE_CHECKING:
    from ipycloud.runtime.checkpoint.catalog import CheckpointInfo

INTERVAL_S = 1.0


class Screen(Protocol):
    """Where the curves are shown: ``show`` puts the HTML in place of what it showed before."""

    def show(self, html: str) -> None: ...


class LiveCurves(Callback):
    """Follows a run: gathers its curves and shows them on ``screen``, throttled by ``clock``
    (seconds, monotonic) to one redraw per ``interval``, with a final one at the end."""

    every_step = False  # the logged rows only

    def __init__(self, screen: Screen, clock: Callable[[], float] = time.monotonic,
                 interval: float = INTERVAL_S) -> None:
        self.screen, self.clock, self.interval = screen, clock, interval
        self.curves = TrainingCurves()
        self._drawn_at: float | None = None
        self._total: int | None = None
        self._state = "starting"
        self._notes: dict[str, str] = {}  # the last checkpoint and the last event

    def on_start(self, start: RunStart) -> None:
        self._total = start.total_steps
        self.curves = TrainingCurves.of(start.past_steps, start.past_epochs)  # a resumed run's

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        self.curves.add_step(logs)
        pace = logs.get("steps_per_s")
        of = f" of {self._total:,}" if self._total else ""
        self._state = f"step {step:,}{of}, epoch {logs['epoch']}" + (
            f", {format_rate(pace)} steps/s" if isinstance(pace, float) else "")
        self._draw_if_due()

    def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        self.curves.add_epoch(logs)
        self._draw_if_due()

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        self._notes["checkpoint"] = f"checkpoint at step {info.step:,}"

    def on_event(self, event: str, message: str) -> None:
        self._notes["event"] = message

    def on_end(self, end: RunEnd) -> None:
        reason = f": {end.reason}" if end.reason else ""
        self._state = f"{end.status} at step {end.step:,}, epoch {end.epoch}{reason}"
        self._notes.pop("event", None)  # the end says it again
        self._draw()

    def _draw_if_due(self) -> None:
        if self._drawn_at is None or self.clock() - self._drawn_at >= self.interval:
            self._draw()

    def _draw(self) -> None:
        self._drawn_at = self.clock()
        if not self.curves.empty():
            self.screen.show(self.curves.html(" · ".join([self._state, *self._notes.values()])))


class DisplayArea:
    """One output of the running cell, shown by the first ``show`` and replaced by the next
    (IPython's display with a display_id, then ``update``)."""

    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, html: str) -> None:
        from IPython.display import display

        bundle = {"text/html": html, "text/plain": "<training curves>"}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)


def live_curves(start: RunStart) -> LiveCurves | None:
    """The callback that draws ``start``'s run in this notebook, or None where it must not:
    no curves asked for, not a Jupyter kernel, or not the kernel's main thread."""
    if not start.curves or threading.current_thread() is not threading.main_thread():
        return None
    if _kernel_shell() is None:
        return None
    return LiveCurves(DisplayArea())


def _kernel_shell() -> Any:
    """The running IPython shell if it is a Jupyter kernel's (IPython never imported here)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell if getattr(shell, "kernel", None) is not None else None
