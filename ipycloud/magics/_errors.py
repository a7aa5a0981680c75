"""Endings of a cell that need no traceback, though they are no mistake in a magic's line
(UsageError is for those): a download that failed, shown as one line of its own kind, and
an interrupted ``fit`` or ``follow``, which has printed its one line already."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from IPython.core.interactiveshell import InteractiveShell

from ipycloud.runtime.runs.follow_run import FollowStopped
from ipycloud.runtime.train.interrupt import FitInterrupted


class MagicFailure(Exception):
    """Something a magic set out to do failed for a reason outside its line: IPython shows
    ``<Kind>: <message>`` on one line, without a traceback."""


class DownloadFailed(MagicFailure):
    """A download (or the extraction of what it fetched) failed."""


QUIET_INTERRUPTS = (FitInterrupted, FollowStopped)  # each printed its line
ENDINGS = (MagicFailure, *QUIET_INTERRUPTS)


def show_without_traceback(ipython: InteractiveShell) -> None:
    """Make ``ipython`` end a cell on ``ENDINGS`` without a traceback: a MagicFailure as its
    one line, a FitInterrupted or FollowStopped with nothing more than the line it
    printed. Exceptions another handler was set for (``set_custom_exc``) still go to that
    handler."""
    earlier: tuple[type[BaseException], ...] = tuple(
        kind for kind in ipython.custom_exceptions if kind not in ENDINGS)
    earlier_handler = ipython.CustomTB

    def end_cell(shell: InteractiveShell, kind: type[BaseException], error: BaseException,
                 traceback: TracebackType | None, tb_offset: int | None = None) -> Any:
        if issubclass(kind, MagicFailure):
            # showtraceback(exception_only=True) would add a line about %tb
            shell._showtraceback(kind, error, shell.InteractiveTB.get_exception_only(kind, error))
            return None
        if issubclass(kind, QUIET_INTERRUPTS):
            return None
        return earlier_handler(kind, error, traceback, tb_offset=tb_offset)

    ipython.set_custom_exc((*earlier, *ENDINGS), end_cell)
