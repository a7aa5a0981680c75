"""File system facilities: which file system holds a path, flushing it whole, kernel copies.

Flushing a whole file system with ``syncfs`` costs one call where fsyncing each of many
small files costs a journal commit each. It is used only where it is known to reach the
disk: local block file systems. On FUSE (Google Drive), NFS and the rest, per-file fsync
stays the way to make data durable.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
# Local file systems whose syncfs writes every dirty page and inode of the file system.
FLUSHED_WHOLE = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "jfs", "nilfs2",
                           "bcachefs", "zfs", "reiserfs", "overlay", "tmpfs"})
# File systems of the machine's own disks and memory: what they hold goes with the machine.
MACHINE_LOCAL = FLUSHED_WHOLE | {"ramfs", "vfat", "exfat", "ntfs3", "fuseblk"}
DRIVE = "fuse.drive"  # Google Drive's mount on Colab
_COPY_CHUNK = 8 * 1024 * 1024
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF,
                   errno.EPERM, errno.ENOTSOCK}
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040`` for a space) decoded; the
    rest, non-ASCII names included, is kept as it is."""
    return _OCTAL_ESCAPE.sub(lambda found: chr(int(found.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, file system type) for every line of a ``/proc/self/mountinfo`` text."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) > separator + 1:
            mounts.append((_unescape(fields[4]), fields[separator + 1]))
    return mounts


def filesystem_type(path: str | os.PathLike[str], mountinfo: str | None = None) -> str | None:
    """The type (``ext4``, ``fuse.drive``, ...) of the file system holding ``path``.

    None where it cannot be told (not Linux, no ``/proc``). ``mountinfo`` stands in for
    the text of ``/proc/self/mountinfo``.
    """
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError:
            return None
    where = os.path.realpath(path)
    best, kind = -1, None
    for point, fstype in parse_mountinfo(mountinfo):
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # later mounts over the same point win
            best, kind = len(point), fstype
    return kind


def on_machine_disk(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies on a file system of this machine's own (a local disk, tmpfs,
    overlay), or where that cannot be told: not on storage that outlives the machine."""
    kind = filesystem_type(path)
    return kind is None or kind in MACHINE_LOCAL


@cache
def _syncfs() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def can_flush_whole(path: str | os.PathLike[str]) -> bool:
    """Whether ``flush_filesystem(path)`` makes everything written there durable."""
    return _syncfs() is not None and filesystem_type(path) in FLUSHED_WHOLE


def flush_filesystem(path: str | os.PathLike[str]) -> None:
    """Write every dirty file and folder of the file system holding ``path`` to disk.

    Use only where ``can_flush_whole(path)``; raises OSError when the flush fails.
    """
    syncfs = _syncfs()
    if syncfs is None:
        raise OSError(errno.ENOSYS, "syncfs is not available here")
    descriptor = os.open(path, os.O_RDONLY)
    try:
        if syncfs(descriptor) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs {path}: {os.strerror(code)}")
    finally:
        os.close(descriptor)


def copy_contents(reader: int, writer: int, size: int,
                  on_bytes: Callable[[int], object] = lambda count: None) -> int:
    """Copy up to ``size`` bytes from one open file to another inside the kernel.

    ``copy_file_range`` first (no trip through user space; a reflink on file systems that
    share blocks), ``sendfile`` where that is refused, a read/write loop last. Returns the
    bytes copied, fewer than ``size`` only when the source ended sooner.
    """
    copied = 0
    for step in _COPY_STEPS:
        try:
            while copied < size:
                count = step(reader, writer, min(_COPY_CHUNK, size - copied), copied)
                if count == 0:
                    return copied
                copied += count
                on_bytes(count)
            return copied
        except OSError as error:
            if error.errno not in _NO_KERNEL_COPY or step is _read_write:
                raise
    return copied


def _copy_file_range(reader: int, writer: int, count: int, offset: int) -> int:
    return os.copy_file_range(reader, writer, count, offset, offset)


def _sendfile(reader: int, writer: int, count: int, offset: int) -> int:
    os.lseek(writer, offset, os.SEEK_SET)
    return os.sendfile(writer, reader, offset, count)


def _read_write(reader: int, writer: int, count: int, offset: int) -> int:
    data = os.pread(reader, count, offset)
    written = 0
    while written < len(data):
        written += os.pwrite(writer, data[written:], offset + written)
    return len(data)


_COPY_STEPS: tuple[Callable[[int, int, int, int], int], ...] = (
    (_copy_file_range, _sendfile, _read_write) if sys.platform.startswith("linux")
    else (_read_write,))
