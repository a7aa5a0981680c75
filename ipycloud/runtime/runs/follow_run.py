"""A run of ``fit`` followed from its record until it ends, wherever it trains: the record
is looked at every INTERVAL_S seconds (only what was appended is read) and each look is
shown by a view: a notebook front's live curves, or ``TextView``'s progress lines. A look
parses what was appended into a summary of bounded size (``log_reader``), so following
holds the same memory however long the log grows; a look that has much to parse (a log
growing by tens of thousands of lines a second) spaces the next, so that following takes
at most BUSY_SHARE of a core.

Following names the run in the user's index of runs as followed by this process, so the
fronts that list this machine's runs (``runs()``, the Jupyter server of this kernel) list
it too, though its log lies outside their folders. A torchrun restart (``restarting``) is
no end: following goes on through it.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.recorder import kernel_id
from ipycloud.runtime.runs.run_watch import Change, RunWatch, find_log
from ipycloud.runtime.runs.summary import LIVE, RunSummary, progress_line
from ipycloud.runtime.user_warning import warn

INTERVAL_S = 1.0  # between two looks at the record, at least
BUSY_SHARE = 0.01  # of a core that looking and showing take, at most
TEXT_EVERY_S = 30.0  # between two progress lines of a TextView while only steps come


class FollowStopped(KeyboardInterrupt):
    """Following stopped by an interrupt (Ctrl-C, a notebook's Stop button); the run goes
    on. Its message is the one line following printed; a notebook front ends the cell
    with that line alone."""


class View(Protocol):
    """How a followed run is shown: ``show`` after each look, ``say`` a line of text."""

    def show(self, run: RunSummary, change: Change) -> None: ...

    def say(self, line: str) -> None: ...


def follow_run(folder: str | os.PathLike[str], run: str | None = None,
               view: View | None = None, interval: float = INTERVAL_S,
               sleep: Callable[[float], None] = time.sleep,
               cpu_clock: Callable[[], float] = time.thread_time) -> RunSummary:
    """Show the run ``run`` (an id; None: the newest) recorded in the checkpoint
    ``folder`` on ``view`` (default: a TextView) until it ends, and return how it ended.
    ``cpu_clock`` (seconds) measures what each look costs, to space them. Raises the
    one-line errors of ``find_log``, and FollowStopped on an interrupt."""
    watch = RunWatch(find_log(folder, run))
    view = TextView() if view is None else view
    try:
        return _follow(watch, view, interval, sleep, cpu_clock)
    except KeyboardInterrupt:
        line = f"stopped following run {watch.summary.id} (it goes on): " \
               f"{progress_line(watch.summary)}"
        view.say(line)
        raise FollowStopped(line).with_traceback(None) from None


def _follow(watch: RunWatch, view: View, interval: float, sleep: Callable[[float], None],
            cpu_clock: Callable[[], float]) -> RunSummary:
    failure: OSError | None = None
    noted = waiting = False
    while True:
        began = cpu_clock()
        change = watch.look()
        if watch.failure is not None and failure is None:
            view.say(f"cannot read {watch.log} ({watch.failure.strerror or watch.failure}); "
                     f"trying again every {interval:g} s")
        elif failure is not None and watch.failure is None:
            view.say(f"reading {watch.log} again")
        failure = watch.failure
        if watch.read_any:
            if not noted:
                _note_follower(watch)
                noted = True
            view.show(watch.summary, change)
            if watch.summary.status not in LIVE:
                return watch.summary
        elif not waiting and failure is None:  # a log its writer has only just made
            view.say(f"waiting for the first record of run {watch.summary.id}")
            waiting = True
        sleep(max(interval, (cpu_clock() - began) / BUSY_SHARE))


def _note_follower(watch: RunWatch) -> None:
    """Name the run in the index as followed by this process."""
    follower = {"pid": os.getpid(), "host": socket.gethostname(), "kernel": kernel_id()}
    try:
        records.add_follower(watch.summary.id, watch.log, follower)
    except OSError as error:
        warn(f"cannot name run {watch.summary.id} in the index of runs "
             f"{records.index_dir()} ({error.strerror or error}): it is followed, "
             "but JupyterLab's Runs will not list it", records.RunRecordWarning)


class TextView:
    """Progress lines on ``out``: where the run stands when following begins, each start,
    epoch and event as it comes, a progress line every TEXT_EVERY_S while steps come, and
    the end. ``clock`` (monotonic seconds) times the progress lines."""

    def __init__(self, out: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.clock = clock
        self._said: tuple[str, int] | None = None  # the status and step of the last line
        self._said_at = 0.0

    def show(self, run: RunSummary, change: Change) -> None:
        if self._said is not None:
            for line in change.appended:
                told = _told(line)
                if told:
                    self.say(f"{_at(line['t'])} {told}")
        moved = self._said is None or self._said[0] != run.status or (
            self._said[1] != run.step and self.clock() - self._said_at >= TEXT_EVERY_S)
        if moved:
            self.say(f"{_at(run.updated or time.time())} run {run.id}: {progress_line(run)}")
            self._said, self._said_at = (run.status, run.step), self.clock()

    def say(self, line: str) -> None:
        print(line, file=self.out or sys.stdout, flush=True)


def _told(line: dict[str, Any]) -> str | None:
    """What a TextView says of a record as it comes: a start, an epoch, an event."""
    kind = line["kind"]
    if kind == records.START:
        return (f"started on {line.get('host')} (process {line.get('pid')}) at step "
                f"{line['step']:,}")
    if kind == records.EPOCH:
        figures = ", ".join(f"{name} {value:.4g}" for name, value in line.items()
                            if isinstance(value, float) and name not in ("t", "seconds"))
        return f"epoch {line['epoch'] + 1} done" + (f": {figures}" if figures else "")
    if kind == records.EVENT:
        return f"{line.get('event')}: {line.get('message')}"
    return None


def _at(unix_time: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(unix_time))
