"""Copying files for sync: a temporary copy beside the target, renamed into place.

A copy that the source changed under is thrown away and made again; one that never
settles is skipped. How the copies become durable depends on where they go:

* On a local file system (ext4, xfs, btrfs, ...) each copy is renamed into place as soon
  as it is complete, and one ``syncfs`` at the end writes everything to disk. A process
  killed midway never leaves a torn file under a final name. After a power cut midway, a
  file whose data had not reached the disk comes back short (these file systems grow a
  file's size on disk only as its data lands), so the next sync, which compares sizes,
  copies it again.
* Elsewhere (Google Drive's FUSE, network disks) copies are fsynced in batches, from a few
  threads at once, before any of them is renamed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ipycloud.runtime.durable import fsync_file, fsync_folder, temp_name_for
from ipycloud.runtime.storage.filesystem import can_flush_whole, copy_contents, flush_filesystem

_RETRIES = 3
_BATCH_FILES = 1000
_BATCH_BYTES = 64 * 1024 * 1024
_FSYNC_THREADS = 8

OnBytes = Callable[[int], object]


@dataclass
class Outcome:
    """What carrying out a sync plan did; paths relative, with ``/``."""

    copied: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_copied: int = 0
    touched: set[str] = field(default_factory=set)  # folders whose entries changed


def _same_version(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stats describe the same, unchanged file."""
    return (a.st_size, a.st_mtime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ino)


def _write_temp(source: str, temp: str, on_bytes: OnBytes) -> int | None:
    """Copy ``source`` into ``temp`` with its mode and times; its size, or None if the
    source changed meanwhile."""
    reader = os.open(source, os.O_RDONLY)
    try:
        before = os.fstat(reader)
        writer = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            copied = copy_contents(reader, writer, before.st_size, on_bytes)
            after = os.fstat(reader)
            if not _same_version(before, after) or copied != after.st_size:
                return None
            os.fchmod(writer, stat.S_IMODE(before.st_mode) & 0o777)
            os.utime(writer, ns=(before.st_atime_ns, before.st_mtime_ns))
        finally:
            os.close(writer)
    finally:
        os.close(reader)
    return copied


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def stage_file(source: str, target: str, on_bytes: OnBytes) -> tuple[str, int] | None:
    """A complete copy of ``source`` under a temporary name beside ``target`` and its size,
    or None when the source kept changing (or vanished)."""
    for _ in range(_RETRIES + 1):
        temp = temp_name_for(target)
        try:
            size = _write_temp(source, temp, on_bytes)
        except FileNotFoundError:
            _unlink(temp)
            if os.path.lexists(source):
                raise
            return None  # deleted from the source since the scan
        except BaseException:
            _unlink(temp)
            raise
        if size is not None:
            return temp, size
        _unlink(temp)
    return None


def copy_link(source: str, target: str) -> bool:
    """Copy one symbolic link as a link; False where the destination refuses links."""
    temp = temp_name_for(target)
    try:
        os.symlink(os.readlink(source), temp)
        os.replace(temp, target)
        return True
    except OSError:
        return False
    finally:
        if os.path.islink(temp):
            os.unlink(temp)


@dataclass
class Placing:
    """Puts staged copies under their final names, durably; see the module docstring."""

    root: str
    flush_whole: bool
    staged: list[tuple[str, str, str, list[str]]] = field(default_factory=list)
    bytes: int = 0

    @classmethod
    def for_target(cls, root: str) -> Placing:
        """The right way for the file system holding ``root``."""
        return cls(root, can_flush_whole(root))

    def add(self, temp: str, target: str, rel: str, done: list[str], outcome: Outcome,
            size: int) -> None:
        """A staged copy of ``rel``, listed in ``done`` once under its final name."""
        self.staged.append((temp, target, rel, done))
        self.bytes += size
        if self.flush_whole or len(self.staged) >= _BATCH_FILES or self.bytes >= _BATCH_BYTES:
            self.commit(outcome)

    def commit(self, outcome: Outcome) -> None:
        """Rename what is staged into place (fsynced first, where that is the way)."""
        if not self.flush_whole and self.staged:
            with ThreadPoolExecutor(max_workers=_FSYNC_THREADS) as pool:
                list(pool.map(fsync_file, [temp for temp, _, _, _ in self.staged]))
        for temp, target, rel, done in self.staged:
            os.replace(temp, target)
            done.append(rel)
            outcome.touched.add(os.path.dirname(target))
        self.staged, self.bytes = [], 0

    def discard(self) -> None:
        """Remove staged copies that will not be committed."""
        for temp, _, _, _ in self.staged:
            _unlink(temp)
        self.staged, self.bytes = [], 0

    def finish(self, outcome: Outcome) -> None:
        """Make every rename and deletion durable."""
        if not outcome.touched:
            return
        if self.flush_whole:
            flush_filesystem(self.root)
            return
        for folder in outcome.touched:
            if os.path.isdir(folder):
                fsync_folder(folder)


def transfer(source: str, target: str, rel: str, link: bool, done: list[str],
             outcome: Outcome, placing: Placing, on_bytes: OnBytes) -> None:
    """Copy one entry: a link at once, a file through ``placing``."""
    if link:
        if copy_link(source, target):
            outcome.touched.add(os.path.dirname(target))
            done.append(rel)
        else:
            outcome.skipped.append(rel)
        return
    staged = stage_file(source, target, on_bytes)
    if staged is None:
        outcome.skipped.append(rel)
        return
    temp, size = staged
    outcome.bytes_copied += size
    placing.add(temp, target, rel, done, outcome, size)
