"""How much an extraction may write, and the count kept against it.

By default an archive may use what the target's file system has free, less a margin (5% of
its size, at most 1 GiB; of its inodes, 5%, at most 100,000): a small archive that expands
to more than the disk holds (a zip or sparse-tar "bomb") is refused instead of filling the
disk. Files count in whole blocks of the file system (a 1-byte file takes a 4 KiB block)
and every member takes an inode. An explicit ``max_total_bytes`` replaces that guard with
a plain count of the files' bytes.

Each member is charged its declared size before a byte of it is written; the writer stops
a member whose real bytes outgrow that declaration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ipycloud.runtime.messages import ParameterError
from ipycloud.runtime.units import format_bytes

_MARGIN_SHARE = 20  # keep 1/20 of the file system free
_MAX_MARGIN = 1 << 30
_MAX_INODE_MARGIN = 100_000


_RAISE_GIVEN = "pass a larger {max_total_bytes} to allow more"
_RAISE_DEFAULT = "free some space, or pass {max_total_bytes} to allow more"


@dataclass(frozen=True)
class ExpansionLimit:
    """What an extraction may use: bytes, files counted in ``block``-sized blocks, and
    entries where the file system counts inodes; ``why`` says where the bytes come from
    and ``remedy`` (a ParameterError template) how to allow more."""

    bytes: int
    why: str
    remedy: str = _RAISE_GIVEN
    block: int = 1
    entries: int | None = None

    @classmethod
    def given(cls, max_total_bytes: int) -> ExpansionLimit:
        """The caller's limit on the files' bytes."""
        if max_total_bytes < 0:
            raise ValueError(f"max_total_bytes must be >= 0, got {max_total_bytes}")
        return cls(max_total_bytes, "the limit given")

    @classmethod
    def free_space(cls, folder: Path) -> ExpansionLimit:
        """What the file system holding ``folder`` has free, less a margin."""
        fs = os.statvfs(folder)
        block = fs.f_frsize or fs.f_bsize or 1
        margin = min(_MAX_MARGIN, fs.f_blocks * block // _MARGIN_SHARE)
        entries = None
        if fs.f_files:  # 0 where the file system does not count inodes
            kept = min(_MAX_INODE_MARGIN, fs.f_files // _MARGIN_SHARE)
            entries = max(0, fs.f_favail - kept)
        why = f"the free space in {folder} less a {format_bytes(margin)} margin"
        return cls(max(0, fs.f_bavail * block - margin), why, _RAISE_DEFAULT, block, entries)


class Budget:
    """What the extraction of ``archive`` has used so far against ``limit``."""

    def __init__(self, archive: Path, limit: ExpansionLimit) -> None:
        self.archive = archive
        self.limit = limit
        self.used = 0
        self.entries = 0

    def charge(self, size: int) -> None:
        """Count one member of ``size`` bytes before writing it; ValueError past the limit."""
        block = self.limit.block
        used = self.used + -(-size // block) * block
        if used > self.limit.bytes:
            raise self._too_big()
        if self.limit.entries is not None and self.entries >= self.limit.entries:
            raise self._too_many()
        self.used = used
        self.entries += 1

    def _too_big(self) -> ParameterError:
        limit = self.limit
        return ParameterError(
            "{archive}: expands to more than {human} ({bytes} bytes), {why}; " + limit.remedy,
            archive=str(self.archive), human=format_bytes(limit.bytes), bytes=str(limit.bytes),
            why=limit.why, max_total_bytes="max_total_bytes=N")

    def _too_many(self) -> ParameterError:
        return ParameterError(
            "{archive}: has more members than the {entries} free inodes of its target less a "
            "margin; free some, or pass {max_total_bytes} to check only the size",
            archive=str(self.archive), entries=str(self.limit.entries),
            max_total_bytes="max_total_bytes=N")
