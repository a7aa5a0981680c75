"""The machine's network traffic between two readings, in bytes per second, from the
interface counters (psutil, ``/proc/net/dev``: in a container, the container's own
interfaces). The loopback interface is left out: it is the machine talking to itself."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from ipycloud.runtime.monitor.rates import Counters, RateMeter

LOOPBACK = "lo"


def interface_counters() -> Counters:
    """Bytes received and sent so far by each interface but the loopback."""
    return {name: (io.bytes_recv, io.bytes_sent)
            for name, io in psutil.net_io_counters(pernic=True).items() if name != LOOPBACK}


class NetworkMeter(RateMeter):
    """Bytes per second (received, sent) since the previous reading; None on the first
    reading and across an interface that appeared, vanished or restarted its counters."""

    def __init__(self, counters: Callable[[], Counters] = interface_counters,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(counters, clock)
