"""The alerts of ``fit``: one message when a run ends (finished, failed with its error's
line, paused, stopped early), queued for the alert thread (``runtime.notify``)."""

from __future__ import annotations

import socket
import time

from ipycloud.runtime import notify
from ipycloud.runtime.train.callback import (
    FAILED,
    FINISHED,
    PAUSED,
    STOPPED_EARLY,
    Callback,
    RunEnd,
    RunStart,
)
from ipycloud.runtime.units import format_seconds

_KINDS = {FINISHED: "finished", FAILED: "failed", PAUSED: "paused",
          STOPPED_EARLY: "stopped_early"}


class RunAlerts(Callback):
    """Tells the configured URLs how a run ended."""

    def __init__(self, start: RunStart) -> None:
        self.start = start
        self._began = time.monotonic()
        self._sigterm: str | None = None  # why a paused run paused, when the machine went

    def on_event(self, event: str, message: str) -> None:
        if event == "sigterm":
            self._sigterm = message

    def on_end(self, end: RunEnd) -> None:
        kind = _KINDS.get(end.status, end.status)
        where = f"step {end.step}, epoch {end.epoch}"
        total = self.start.total_steps
        if total:
            where = f"step {end.step} of {total}, epoch {end.epoch}"
        took = format_seconds(time.monotonic() - self._began)
        reasons = [reason for reason in (self._sigterm, end.reason) if reason]
        lines = [*reasons, f"{where}, after {took} on {socket.gethostname()}"]
        if self.start.folder is not None:
            lines.append(f"checkpoints: {self.start.folder}")
        notify.notify(kind, f"ipycloud: training {end.status}", "\n".join(lines))


def run_alerts(start: RunStart) -> RunAlerts | None:
    """The alerts of a run, for the process that shows it, when alerts are configured."""
    if not start.main or not notify.configured():
        return None
    return RunAlerts(start)
