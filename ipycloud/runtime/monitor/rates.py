"""Rates between two readings of a machine's cumulative counters, in units per second: the
network's traffic by interface, the disks' reads and writes by device.

A rate is unknown (None) rather than wrong: on the first reading, when the counters cannot
be read, and across a counter that appeared, vanished or went back (restarted).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

# Two counters so far (bytes received and sent, read and written...), by name.
Counters = Mapping[str, tuple[int, int]]


class RateMeter:
    """The two counters' sums per second since the previous reading; not thread-safe.

    ``counters`` reads them now; it raises OSError (or psutil's NotImplementedError) when
    the machine has none to read.
    """

    def __init__(self, counters: Callable[[], Counters],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._counters, self._clock = counters, clock
        self._last: tuple[float, Counters] | None = None

    def read(self) -> tuple[float | None, float | None]:
        """The first and second counter per second since the previous call, summed over the
        names; None on the first call, when the counters cannot be read, and across a name
        that appeared, vanished or restarted its counters."""
        try:
            now = (self._clock(), self._counters())
        except (OSError, NotImplementedError):  # no /proc file (a sandbox): no baseline
            self._last = None
            return None, None
        last, self._last = self._last, now
        if last is None or now[0] <= last[0] or set(now[1]) != set(last[1]):
            return None, None
        deltas = [(now[1][name][0] - last[1][name][0], now[1][name][1] - last[1][name][1])
                  for name in now[1]]
        if any(first < 0 or second < 0 for first, second in deltas):
            return None, None
        seconds = now[0] - last[0]
        return (sum(first for first, _ in deltas) / seconds,
                sum(second for _, second in deltas) / seconds)
