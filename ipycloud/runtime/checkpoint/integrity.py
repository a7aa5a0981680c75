"""Whether a checkpoint's files are what its manifest says (size and CRC-32), reading little.

A checksum this process computed (writing a file, or verifying it) is reused while the
file's stat (device, inode, size, modification and change times) is unchanged: nothing
has written to the file since. As git does for its index, a checksum whose stat was taken
less than RACY_NS after the file's content last changed is not reused, since a write
within the same timestamp tick would leave the stat as it was; the next check reads the
file again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.durable import FileDigest
from ipycloud.runtime.per_process import per_process

RACY_NS = 20_000_000  # longer than any kernel's file timestamp tick (at most 10 ms)


class _Known(NamedTuple):
    signature: tuple[int, ...]  # the stat the content had when its checksum was taken
    crc32: str


@per_process()
def _known() -> dict[str, _Known]:
    """Absolute path of a data file -> the checksum of its content, as of a stat."""
    return {}


def _signature(status: os.stat_result) -> tuple[int, ...]:
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns,
            status.st_ctime_ns)


def remember(path: Path, crc32: str, status: os.stat_result, taken_ns: int) -> None:
    """Record ``crc32`` as the checksum of ``path`` while its stat is ``status``, a stat
    taken at ``time.time_ns()`` = ``taken_ns``, after the content was last written and
    before it was read."""
    key = os.path.abspath(path)
    if taken_ns - status.st_mtime_ns < RACY_NS:
        _known().pop(key, None)
    else:
        _known()[key] = _Known(_signature(status), crc32)


def remember_written(path: Path, crc32: str) -> None:
    """Record the checksum of a file this process has just written, read back and renamed
    into place (a large file's fsync and read-back usually take it past RACY_NS)."""
    remember(path, crc32, os.stat(path), time.time_ns())


def problem(info: CheckpointInfo, *, read: bool = True, read_back: bool = False) -> str | None:
    """Why the checkpoint's files do not match its manifest, or None when they do.

    Sizes are always checked. A checksum is read from the file only with ``read``, and
    only when this process does not know it already; without ``read`` an unknown
    checksum counts as matching. ``read_back`` reads every file again, even one whose
    checksum is known (the check before nothing but the folder holds the run). An OSError
    other than a missing file (a lost mount, an I/O error) is raised: the folder cannot
    say now.
    """
    for file_name, expected in info.files.items():
        path = info.directory / file_name
        try:
            taken_ns = time.time_ns()
            status = path.stat()
            if status.st_size != expected.get("size"):  # truncation needs no reading
                return (f"{file_name} has {status.st_size} bytes, the manifest says "
                        f"{expected.get('size')}")
            crc32 = None if read_back else known_crc32(path, status)
            if crc32 is None and (read or read_back):
                crc32 = FileDigest.of(path).crc32
                remember(path, crc32, status, taken_ns)
        except FileNotFoundError:
            return f"{file_name} is missing"
        if crc32 is not None and crc32 != expected.get("crc32"):
            return f"{file_name} fails its CRC-32 check"
    return None


def known_crc32(path: Path, status: os.stat_result) -> str | None:
    """The checksum this process knows for ``path`` with this stat, or None."""
    entry = _known().get(os.path.abspath(path))
    return entry.crc32 if entry is not None and entry.signature == _signature(status) else None


def trusted(info: CheckpointInfo) -> bool:
    """Whether every file of the checkpoint is known to match without reading it."""
    for file_name, expected in info.files.items():
        path = info.directory / file_name
        try:
            status = path.stat()
        except OSError:
            return False
        if (status.st_size != expected.get("size")
                or known_crc32(path, status) != expected.get("crc32")):
            return False
    return True
