"""The machine's disk I/O between two readings, in bytes per second read and written, from
the block devices' counters (psutil, ``/proc/diskstats``: not per container, so in a
container the host's disks).

Each byte counts once: a partition is left out when its whole disk is counted too (the
disk's counters include its partitions'), and so are loop devices (their I/O reaches the
disk holding their file) and RAM disks (``ram``, ``zram``: memory, not a disk).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

import psutil

from ipycloud.runtime.monitor.rates import Counters, RateMeter

NOT_DISKS = ("loop", "ram", "zram")  # name prefixes of the devices left out

# A partition's name as the kernel makes it: its disk's name and a number, with a "p"
# between when the disk's name ends in a digit (sda1 of sda, nvme0n1p1 of nvme0n1).
_PARTITION = re.compile(r"(?P<numbered>.*\d)p\d+|(?P<lettered>.*\D)\d+")


def whole_disks(names: Iterable[str]) -> set[str]:
    """The names of the block devices whose I/O counts: neither a loop nor a RAM device,
    nor a partition of a disk among ``names``."""
    devices = {name for name in names if not name.startswith(NOT_DISKS)}
    return {name for name in devices if _disk_of(name) not in devices}


def block_device_counters() -> Counters:
    """Bytes read and written so far by each whole disk (see ``whole_disks``); OSError
    when there is none (a sandbox's empty ``/proc/diskstats``): no I/O is not 0 B/s."""
    found = psutil.disk_io_counters(perdisk=True, nowrap=False)  # a reset must show
    disks = whole_disks(found)
    if not disks:
        raise OSError("no block device to read the I/O of")
    return {name: (found[name].read_bytes, found[name].write_bytes) for name in disks}


class DiskIoMeter(RateMeter):
    """Bytes per second (read, written) since the previous reading; None on the first
    reading and across a disk that appeared, vanished or restarted its counters."""

    def __init__(self, counters: Callable[[], Counters] = block_device_counters,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(counters, clock)


def _disk_of(name: str) -> str | None:
    """The disk that ``name`` would be a partition of; None for a name that cannot be one."""
    match = _PARTITION.fullmatch(name)
    return None if match is None else match["numbered"] or match["lettered"]
