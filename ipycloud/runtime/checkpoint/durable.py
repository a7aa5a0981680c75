"""Durable files: write under a temporary name, fsync, rename, fsync the folder.

Only POSIX rename is relied on, so this works on any file system a notebook mounts
(local disk, a network disk, Google Drive through FUSE). Where a file system refuses to
fsync a folder, the rename alone has to do.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

TEMP_PREFIX = ".tmp-"
LOCK_NAME = ".ipycloud.lock"
_CHUNK = 8 * 1024 * 1024
# fsync on a folder is refused by some FUSE and network file systems; the rename still holds.
_FOLDER_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF,
                             errno.EISDIR, errno.EACCES}


@dataclass(frozen=True)
class FileDigest:
    """Size and SHA-256 of a file's content."""

    size: int
    sha256: str


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._hash = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None  # a failed write, even if the producer swallowed it

    def write(self, data: bytes | memoryview) -> int:
        self._hash.update(data)
        try:
            written = self._raw.write(data)
        except OSError as error:
            self.error = error
            raise
        self.size += len(data) if written is None else written
        return written

    def flush(self) -> None:
        self._raw.flush()

    def digest(self) -> FileDigest:
        return FileDigest(self.size, self._hash.hexdigest())


def temp_name_for(final: Path) -> Path:
    """A temporary path beside ``final`` naming this process, so stale ones can be found."""
    return final.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{final.name}")


def fsync_folder(folder: Path) -> None:
    """Make a folder's entries (renames, deletions) durable, where the file system allows."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError as error:
        if error.errno in _FOLDER_FSYNC_UNSUPPORTED:
            return
        raise
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno not in _FOLDER_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(descriptor)


def write_atomically(final: Path, produce: Callable[[BinaryIO], object]) -> FileDigest:
    """Write ``final`` through ``produce(file)`` so that it appears whole or not at all.

    The content goes to a temporary name in the same folder, is flushed and fsynced, then
    renamed over ``final``; the folder is fsynced last. On any error or interrupt the
    temporary file is removed and ``final`` is untouched.
    """
    temporary = temp_name_for(final)
    try:
        with open(temporary, "xb") as raw:
            writer = _HashingWriter(raw)
            try:
                produce(writer)  # type: ignore[arg-type]
            except Exception:
                # torch.save turns a failed write (disk full) into a RuntimeError about
                # stream positions: raise the OSError that actually happened.
                if writer.error is not None:
                    raise writer.error from None
                raise
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    fsync_folder(final.parent)
    return writer.digest()


def write_bytes_atomically(final: Path, data: bytes) -> FileDigest:
    """Write ``data`` to ``final`` atomically and durably."""
    return write_atomically(final, lambda file: file.write(data))


def digest_of(path: Path) -> FileDigest:
    """Size and SHA-256 of a file, read in large chunks."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return FileDigest(size, sha.hexdigest())


def _writer_pid(name: str) -> int | None:
    """The PID a temporary name was made by, or None if the name is not one of ours."""
    if not name.startswith(TEMP_PREFIX):
        return None
    pid = name[len(TEMP_PREFIX):].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temporaries(folder: Path) -> Iterator[Path]:
    """Temporary files left by writers that died (or by this process, between writes)."""
    for entry in folder.iterdir():
        pid = _writer_pid(entry.name)
        if pid is not None and (pid == os.getpid() or not _process_alive(pid)):
            yield entry


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``folder`` where the file system supports one.

    Two processes saving into one folder then take turns; a killed holder releases the
    lock with its death. File systems without locks (some FUSE mounts) go unlocked.
    """
    try:
        import fcntl
        descriptor = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)
