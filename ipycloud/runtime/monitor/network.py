"""The machine's network traffic between two readings, in bytes per second, from the
interface counters (psutil, ``/proc/net/dev``: in a container, the container's own
interfaces). The loopback interface is left out: it is the machine talking to itself."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import psutil

LOOPBACK = "lo"

# Bytes (received, sent) so far, by interface name.
Counters = Mapping[str, tuple[int, int]]


def interface_counters() -> Counters:
    """Bytes received and sent so far by each interface but the loopback."""
    return {name: (io.bytes_recv, io.bytes_sent)
            for name, io in psutil.net_io_counters(pernic=True).items() if name != LOOPBACK}


class NetworkMeter:
    """Bytes per second received and sent since the previous reading; not thread-safe."""

    def __init__(self, counters: Callable[[], Counters] = interface_counters,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._counters, self._clock = counters, clock
        self._last: tuple[float, Counters] | None = None

    def read(self) -> tuple[float | None, float | None]:
        """(received, sent) bytes per second since the previous call; None on the first
        call, when the counters cannot be read, and across an interface that appeared,
        vanished or restarted its counters."""
        try:
            now = (self._clock(), self._counters())
        except OSError:  # no /proc/net/dev (a sandbox): unknown, and no baseline
            self._last = None
            return None, None
        last, self._last = self._last, now
        if last is None or now[0] <= last[0] or set(now[1]) != set(last[1]):
            return None, None
        deltas = [(now[1][name][0] - last[1][name][0], now[1][name][1] - last[1][name][1])
                  for name in now[1]]
        if any(received < 0 or sent < 0 for received, sent in deltas):
            return None, None
        seconds = now[0] - last[0]
        return (sum(received for received, _ in deltas) / seconds,
                sum(sent for _, sent in deltas) / seconds)
