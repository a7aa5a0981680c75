"""Durable files: write under a temporary name, fsync, rename, fsync the folder.

Only POSIX rename is relied on, so this works on any file system a notebook mounts
(local disk, a network disk, Google Drive through FUSE). Where a file system refuses to
fsync a folder, the rename alone has to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

A = TypeVar("A")
B = TypeVar("B")
PathLike = TypeVar("PathLike", str, Path)

TEMP_PREFIX = ".tmp-"
# What temp_name_for makes: the prefix, the writer's PID, 8 hex digits, the final name (or
# its start).
_TEMP_NAME = re.compile(rf"{re.escape(TEMP_PREFIX)}(\d+)-[0-9a-f]{{8}}-.")
# The shortest limit on a name's length in bytes (NAME_MAX) in common use: eCryptfs's.
# Every file system allows a name this long, and one as long as any name it already holds.
_SAFE_NAME_BYTES = 143
LOCK_NAME = ".ipycloud.lock"
# What a mount whose file system went away answers (a dead FUSE daemon, a stale NFS handle).
LOST_MOUNT_ERRORS = frozenset({errno.ENOTCONN, errno.ESTALE})
_CHUNK = 8 * 1024 * 1024  # read and checksummed in slices this size: as fast as a map
# A process that started this long after a temporary file last changed is not its writer
# (process start times are known to about a second).
_PID_REUSE_SLACK_S = 2.0
# fsync on a folder is refused by some FUSE and network file systems; the rename still holds.
_FOLDER_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF,
                             errno.EISDIR, errno.EACCES}


@dataclass(frozen=True)
class FileDigest:
    """Size and CRC-32 of a file's content: enough to catch truncation and flipped bytes.

    It guards against accidents (a kernel killed mid-write, a damaged disk or sync), not
    against tampering: what makes loading safe is ``torch.load(weights_only=True)``.
    """

    size: int
    crc32: str  # eight hex digits

    @classmethod
    def of(cls, path: Path) -> FileDigest:
        """Read ``path`` in large slices and checksum it. Read, never mapped: a page of a
        map that the disk fails to read (an I/O error, a lost mount) ends the process with
        SIGBUS, where a read raises OSError."""
        checksum = size = 0
        with open(path, "rb", buffering=0) as file:
            slice_bytes = min(_CHUNK, max(os.fstat(file.fileno()).st_size, 1))
            buffer = memoryview(bytearray(slice_bytes))
            while count := file.readinto(buffer):  # the read and zlib release the GIL
                checksum = zlib.crc32(buffer[:count], checksum)
                size += count
        return cls(size, f"{checksum:08x}")


class _RecordingWriter:
    """A write-only file object that remembers a failed write.

    torch.save turns a failed write (a full disk) into a RuntimeError about stream
    positions; the OSError recorded here is the one worth showing.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.error: OSError | None = None

    def write(self, data: bytes | memoryview) -> int:
        try:
            return self._raw.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self._raw.flush()


def side_by_side(background: Callable[[], A], foreground: Callable[[], B]) -> tuple[A, B]:
    """Run two blocking calls at once (both release the GIL) and return both results.

    The background call's exception is raised after the foreground one finishes. Where no
    thread can be started (at interpreter exit), the calls run one after the other.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = background()
        except BaseException as error:
            outcome["error"] = error

    worker = threading.Thread(target=run, name="ipycloud-side-by-side", daemon=True)
    try:
        worker.start()
    except RuntimeError:  # interpreter shutdown
        run()
    try:
        result = foreground()
    finally:
        if worker.ident is not None:
            worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], result


def temp_name_for(final: PathLike) -> PathLike:
    """A temporary path beside ``final`` naming this process, so stale ones can be found.

    Its name is ``.tmp-<pid>-<8 hex digits>-`` then the final name, cut short where the
    whole would pass both the final name's length and ``_SAFE_NAME_BYTES`` (in bytes), so
    it is legal wherever the final name is. A ``str`` in, a ``str`` out (the fast path for
    copying many files); a Path for a Path.
    """
    folder, name = os.path.split(final)
    head = f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
    temp = os.path.join(folder, head + _shortened(name, len(head)))
    return temp if isinstance(final, str) else type(final)(temp)


def _shortened(name: str, head_bytes: int) -> str:
    """``name``, or as much of its start as fits after ``head_bytes`` bytes of ASCII; never
    a UTF-8 character cut in two."""
    raw = os.fsencode(name)
    room = max(len(raw), _SAFE_NAME_BYTES) - head_bytes
    if len(raw) <= room:
        return name
    for _ in range(3):  # a character's continuation bytes, at most three
        if raw[room] & 0xC0 != 0x80:
            break
        room -= 1
    return os.fsdecode(raw[:room])


def is_temporary(name: str) -> bool:
    """Whether a file name is one ``temp_name_for`` makes."""
    return name.startswith(TEMP_PREFIX) and _TEMP_NAME.match(name) is not None


def fsync_folder(folder: str | os.PathLike[str]) -> None:
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


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Write a file's data and size to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> list[tuple[str, int]]:
    """fsync every regular file and folder under ``root`` (links not followed, folders after
    what they hold); returns each regular file's relative ``/``-separated path and size, sorted.
    """
    files: list[tuple[str, int]] = []
    _fsync_subtree(os.fspath(root), "", files)
    return sorted(files)


def _fsync_subtree(folder: str, prefix: str, files: list[tuple[str, int]]) -> None:
    """fsync ``folder`` (``prefix`` is its relative path plus ``/``, or empty) and below."""
    folders = []
    with os.scandir(folder) as entries:
        for entry in entries:
            info = entry.stat(follow_symlinks=False)  # one lstat per entry
            if stat.S_ISREG(info.st_mode):
                fsync_file(entry.path)
                files.append((prefix + entry.name, info.st_size))
            elif stat.S_ISDIR(info.st_mode):
                folders.append(entry)
    for entry in folders:
        _fsync_subtree(entry.path, f"{prefix}{entry.name}/", files)
    fsync_folder(folder)


def refuse_a_file(folder: str | os.PathLike[str]) -> None:
    """NotADirectoryError (its words: ``<file> is a file, not a folder``, no error number)
    when ``folder``, or a parent of it, is a file; missing folders are no error. Another
    trouble reading the path (a lost mount) raises its own OSError."""
    for path in (Path(folder), *Path(folder).parents):
        try:
            mode = path.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISDIR(mode):
            return
        raise NotADirectoryError(f"{path} is a file, not a folder")


def make_folder(folder: Path, mount: Path | None = None) -> Path | None:
    """Make ``folder`` and its missing parents; return the mount point of its file system.

    ``mount`` is that mount point as last seen (where the folder was, or would be made).
    Where the folder is missing and that file system is mounted no more (a Drive mount that
    went away), nothing is made: the folder would land in the bare mount point left on the
    disk below, where the returning mount would hide it (and FUSE refuses to mount over
    it). That raises FileNotFoundError.
    """
    if not folder.is_dir():
        if mount is not None and not _mounted(mount):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory, and the file "
                                    f"system it was on is no longer mounted at {mount}",
                                    str(folder))
        folder.mkdir(parents=True, exist_ok=True)
    return mount_point(folder)


def _mounted(mount: Path) -> bool:
    """Whether ``mount`` is a mount point still; raises the OSError its file system
    answers (ENOTCONN for a mount whose connection dropped)."""
    try:
        os.lstat(mount)
    except FileNotFoundError:
        return False
    return os.path.ismount(mount)


def mount_point(path: Path) -> Path | None:
    """The mount point of the file system that holds ``path`` or, where it is missing, its
    nearest existing parent. Of a mount that no longer answers (ENOTCONN, ESTALE), the
    outermost path that fails: its mount point. None where another error hides it."""
    path = Path(os.path.abspath(path))
    lost: Path | None = None
    while path.parent != path:
        try:
            if path.exists() and os.path.ismount(path):
                return path
        except OSError as error:
            if error.errno not in LOST_MOUNT_ERRORS:
                return None
            lost = path
        else:
            if lost is not None:
                return lost
        path = path.parent
    return lost or path


def remove_path(path: str | os.PathLike[str]) -> None:
    """Remove a file, a link or a whole folder tree (links inside are not followed); what is
    already gone is no error."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def replace_folder(new: Path, final: Path) -> None:
    """Rename the folder ``new`` to ``final``, durably; whatever ``final`` held is moved aside
    first and removed only once ``new`` is in place (put back if the rename fails)."""
    aside = None
    if os.path.lexists(final):
        aside = temp_name_for(final)
        os.rename(final, aside)
    try:
        os.rename(new, final)
    except BaseException:
        if aside is not None:
            os.rename(aside, final)
        raise
    fsync_folder(final.parent)
    if aside is not None:
        with contextlib.suppress(OSError):
            remove_path(aside)


def _create(path: Path, mode: int | None) -> BinaryIO:
    """A new file (never through a link) open for writing: mode ``0o666`` less the umask,
    as ``open`` makes it, or exactly ``mode`` from the start."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    descriptor = os.open(path, flags, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(descriptor, mode)  # whatever the umask
        return os.fdopen(descriptor, "wb")
    except BaseException:
        os.close(descriptor)
        raise


def write_atomically(final: Path, produce: Callable[[BinaryIO], object],
                     mode: int | None = None) -> FileDigest:
    """Write ``final`` through ``produce(file)`` so that it appears whole or not at all.

    ``write_temporary`` then ``commit_temporary``: on any error or interrupt the temporary
    file is removed and ``final`` is untouched.
    """
    temporary, digest = write_temporary(final, produce, mode)
    commit_temporary(temporary, final)
    return digest


def write_temporary(final: Path, produce: Callable[[BinaryIO], object],
                    mode: int | None = None) -> tuple[Path, FileDigest]:
    """Write a complete, durable copy of ``final``'s new content under a temporary name
    beside it, through ``produce(file)``; returns that name and the content's digest.

    The content is flushed; while fsync waits for the disk, the file is read back and
    checksummed, so the digest describes what the file system holds, not what was meant
    to be written. On any error or interrupt the temporary file is removed. The file has
    ``mode`` from the moment it exists (default: ``0o666`` less the umask).
    """
    temporary = temp_name_for(final)
    try:
        with _create(temporary, mode) as raw:
            writer = _RecordingWriter(raw)
            try:
                produce(writer)  # type: ignore[arg-type]
            except Exception:
                if writer.error is not None:
                    raise writer.error from None
                raise
            raw.flush()
            _, digest = side_by_side(lambda: os.fsync(raw.fileno()),
                                     lambda: FileDigest.of(temporary))
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    return temporary, digest


def commit_temporary(temporary: Path, final: Path) -> None:
    """Rename a ``write_temporary`` file over ``final`` and make the rename durable; on
    failure the temporary file is removed and ``final`` is untouched."""
    try:
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    fsync_folder(final.parent)


def write_bytes_atomically(final: Path, data: bytes, mode: int | None = None) -> FileDigest:
    """Write ``data`` to ``final`` atomically and durably (``mode`` as in write_atomically)."""
    return write_atomically(final, lambda file: file.write(data), mode)


def _writer_pid(name: str) -> int | None:
    """The PID a temporary name was made by, or None if the name is not one of ours."""
    found = _TEMP_NAME.match(name)
    return int(found.group(1)) if found else None


def _writer_running(pid: int, changed: float | None) -> bool:
    """Whether the process ``pid`` runs and may have written a file last changed at
    ``changed`` (Unix seconds; None: unknown)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # ended, not reaped yet
            return False
        return changed is None or process.create_time() <= changed + _PID_REUSE_SLACK_S
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to look at: it runs
        return True


def stale_temporary(name: str, changed: float | None = None) -> bool:
    """Whether ``name`` is a temporary file of a writer that is gone (or of this process,
    between writes).

    A writer is gone when no process runs with its PID (one that ended but is not reaped
    yet included), or, given ``changed`` (when the file last changed, in Unix seconds),
    when the process with that PID started after it: another process took the PID over.
    """
    pid = _writer_pid(name)
    return pid is not None and (pid == os.getpid() or not _writer_running(pid, changed))


def stale_temporaries(folder: Path) -> Iterator[Path]:
    """Temporary files left by writers that died (or by this process, between writes)."""
    for entry in folder.iterdir():
        if not is_temporary(entry.name):
            continue
        try:
            changed = entry.lstat().st_mtime
        except FileNotFoundError:
            continue
        if stale_temporary(entry.name, changed):
            yield entry


class _FolderLocks:
    """This process's side of the folder locks: one lock per folder for its threads, and
    the descriptors of the lock files held open.

    A forked child gets fresh locks (one held by another thread at the fork would stay
    held there forever) and closes the descriptors of lock files it inherited from threads
    it lacks: those recorded, and on Linux any other open on a lock file (a thread forked
    from between its ``open`` and its record, or between forgetting and closing one).
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self.descriptors: set[int] = set()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._in_child)

    def for_folder(self, folder: Path) -> threading.Lock:
        key = os.path.realpath(folder)  # one lock, however the folder is named
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _in_child(self) -> None:
        self._guard = threading.Lock()
        self._locks = {}
        for descriptor in self.descriptors | _open_lock_files():
            with contextlib.suppress(OSError):
                os.close(descriptor)
        self.descriptors = set()


def _open_lock_files() -> set[int]:
    """This process's descriptors open on a folder's lock file (none where /proc is not)."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}").endswith(f"/{LOCK_NAME}"):
                    found.add(int(name))
    return found


_folder_locks = _FolderLocks()


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` against other threads and other processes.

    Threads of this process take turns on a lock of their own; processes on an ``flock``
    of the folder's lock file, where the file system supports one. The lock belongs to the
    open file, which only this holder has: a forked child (a DataLoader worker, a
    ``launch`` rank) closes its inherited copy at once, another open and close of the lock
    file in this process (a sync copying the folder) leaves it held, and a killed holder
    releases it with its death. File systems without locks (some FUSE mounts) go unlocked.
    """
    with _folder_locks.for_folder(folder):
        try:
            import fcntl
            descriptor = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except (ImportError, OSError):
            yield
            return
        _folder_locks.descriptors.add(descriptor)
        try:
            with contextlib.suppress(OSError):
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            _folder_locks.descriptors.discard(descriptor)  # before its number can be reused
            os.close(descriptor)  # also releases the lock
