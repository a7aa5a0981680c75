"""The session guard's status: the session's clock, its limit, and what the guard did."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ipycloud.runtime.units import format_duration, format_seconds


@dataclass(frozen=True)
class GuardStatus:
    """A snapshot of the session guard; ``str()`` gives the text shown in the notebook."""

    running: bool
    platform: str
    elapsed_s: float  # since the kernel process started
    limit_s: float | None
    limit_source: str  # "as given", "Google Colab's limit", or why none is known
    next_warning_s: float | None  # elapsed seconds of the next warning point
    warnings_s: tuple[float, ...]
    interval_s: float | None  # between activity pings; None while stopped
    kernel_pings: int | None  # None: not in a Jupyter kernel
    browser_pings: int | None  # None: no browser ping
    browser_last_ping: float | None  # time.time() of the browser's latest ping
    sigterm: str
    actions: tuple[str, ...]
    last_run: str | None
    notices: tuple[str, ...]
    # How to start the guard and give a limit, in the words of the front that shows this.
    start_hint: str = "ipycloud.runtime.guard.guard.session_guard().start()"
    limit_hint: str = "GuardSettings(limit_s=...)"

    @property
    def time_left_s(self) -> float | None:
        """Seconds until the session limit (negative once passed); None without a limit."""
        return None if self.limit_s is None else self.limit_s - self.elapsed_s

    def lines(self) -> list[str]:
        """The status as lines of text."""
        return [self._state(), self._clock(), f"next warning: {self._next_warning()}",
                f"SIGTERM: {self.sigterm}",
                f"deadline actions: {', '.join(self.actions) or 'none registered'}",
                f"last run: {self.last_run or 'none yet'}",
                *(["notices:"] + [f"  {notice}" for notice in self.notices]
                  if self.notices else [])]

    def _state(self) -> str:
        if not self.running or self.interval_s is None:
            return f"keepalive: stopped (start it with {self.start_hint})"
        kernel = ("not in a Jupyter kernel, nothing to ping" if self.kernel_pings is None
                  else f"{self.kernel_pings} kernel pings sent")
        browser = "" if self.browser_pings is None else f", {self._browser()}"
        return (f"keepalive: running, a ping every {format_seconds(self.interval_s)} "
                f"({kernel}{browser})")

    def _browser(self) -> str:
        """The browser ping's count, and how long ago the tab last called (a closed or
        sleeping tab stops calling)."""
        if self.browser_last_ping is None:
            return f"{self.browser_pings} browser pings (none yet: is the notebook tab open?)"
        ago = format_duration(max(time.time() - self.browser_last_ping, 0.0))
        return f"{self.browser_pings} browser pings, the last {ago} ago"

    def _clock(self) -> str:
        elapsed = f"elapsed {format_duration(self.elapsed_s)}"
        if self.limit_s is None or self.time_left_s is None:
            return (f"{self.platform}: {elapsed}; session limit: {self.limit_source}; give "
                    f"one with {self.limit_hint}")
        left = (f"{format_duration(self.time_left_s)} left" if self.time_left_s > 0
                else "the limit has passed")
        return (f"{self.platform}: {elapsed} of {format_seconds(self.limit_s)} "
                f"({self.limit_source}), {left}")

    def _next_warning(self) -> str:
        if self.limit_s is None:
            return "none (no session limit)"
        if self.next_warning_s is None:
            return "none left" if self.warnings_s else "none asked for"
        before = format_seconds(self.limit_s - self.next_warning_s)
        wait = self.next_warning_s - self.elapsed_s
        return (f"in {format_duration(wait)} ({before} before the limit)" if wait > 0
                else f"now ({before} before the limit)")

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))
