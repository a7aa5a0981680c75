"""The fault-injecting pass-through FUSE file system, run as its own process.

``python faultfs_daemon.py BACKING MOUNTPOINT CONTROL PARENT_PID`` mirrors the folder
BACKING at MOUNTPOINT (fusepy over libfuse 2) and serves commands on the Unix socket
CONTROL; tests/faultfs.py (process PARENT_PID) starts it and sends the commands. Should
that process end without unmounting, this one removes CONTROL's folder, unmounts and
ends. Every file operation
is checked against the faults in force when it starts, so a command answered by this
process applies to the very next operation. The kernel caches neither names nor
attributes (every timeout 0); reads go through its page cache, which is dropped at
every open. Locks are left to the kernel (no ``lock`` or ``flock`` operation).

This module imports neither pytest nor anything from the tests, so it starts quickly.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from typing import Any

# Each FUSE operation's class: faults are set by class. Opening a file to write or to
# truncate it counts as "create"; opening it to read only, as "open".
CLASS_OF = {
    "getattr": "stat", "access": "stat", "readlink": "stat", "statfs": "stat",
    "opendir": "listdir", "readdir": "listdir",
    "open": "open",
    "create": "create", "open_write": "create", "mknod": "create", "truncate": "create",
    "read": "read",
    "write": "write",
    "flush": "flush",
    "fsync": "fsync", "fsyncdir": "fsync",
    "rename": "rename",
    "unlink": "unlink", "rmdir": "unlink",
    "mkdir": "mkdir",
    "symlink": "link", "link": "link",
    "chmod": "setattr", "chown": "setattr", "utimens": "setattr",
}
OPERATIONS = frozenset(CLASS_OF.values())
CALLS_KEPT = 100_000
STAT_FIELDS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size",
               "st_blksize", "st_blocks")
STATVFS_FIELDS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                  "f_ffree", "f_favail", "f_flag", "f_namemax")
WRITE_ACCESS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC


@dataclass
class Fault:
    """Answer the operations of the classes ``operations`` with ``error``.

    path: only for paths (relative to the mount) that match this fnmatch pattern; a
    rename or hard link matches by either name. after_bytes: only once this many more
    bytes have been written (to matching paths); a write that crosses the mark is cut
    short there when "write" is among the operations. times: only this many calls, then
    the fault is gone.
    """

    error: int
    operations: frozenset[str]
    path: str | None = None
    after_bytes: int | None = None
    times: int | None = None

    def covers(self, paths: Iterable[str | None]) -> bool:
        """Whether the fault applies to an operation on ``paths``."""
        return self.path is None or any(
            path is not None and fnmatch.fnmatchcase(path, self.path) for path in paths)

    def armed(self) -> bool:
        """Whether the bytes it waits for have all been written."""
        return not self.after_bytes


def relative(path: str | None) -> str | None:
    """A path in the mount as fusepy gives it ("/a/b"), relative to the mount ("a/b", or
    "." for the mount itself); None for a file that is open but has no name any more."""
    return None if path is None else path.lstrip("/") or "."


class Faults:
    """The faults and write delay in force, and the log of calls; shared by all threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.write_delay = 0.0
        self.calls: deque[tuple[str, str | None]] = deque(maxlen=CALLS_KEPT)

    def command(self, name: str, argument: Any) -> Any:
        """Apply one command from the controller; return its answer."""
        with self.lock:
            if name == "fail":
                self.faults.append(argument)
            elif name == "slow":
                self.write_delay = argument
            elif name == "heal":
                self.faults.clear()
                self.write_delay = 0.0
            elif name == "calls":
                calls = list(self.calls)
                self.calls.clear()
                return calls
            else:
                raise ValueError(f"unknown command {name!r}")
        return None

    def check(self, operation: str, *paths: str | None) -> None:
        """Log the call; raise the error of the first armed fault covering it."""
        with self.lock:
            self._check(operation, tuple(map(relative, paths)))

    def admit_write(self, path: str | None, size: int) -> tuple[int, float]:
        """Log a write of ``size`` bytes; raise its fault, or return how many of the bytes
        to write and how long to wait first."""
        with self.lock:
            path = relative(path)
            self._check("write", (path,))
            waiting = [fault for fault in self.faults
                       if fault.after_bytes and fault.covers((path,))]
            allowed = min([size, *(fault.after_bytes or 0 for fault in waiting
                                   if "write" in fault.operations)])
            for fault in waiting:
                fault.after_bytes = max(0, (fault.after_bytes or 0) - allowed)
            return allowed, self.write_delay

    def _check(self, operation: str, paths: tuple[str | None, ...]) -> None:
        self.calls.append((operation, paths[0]))
        kind = CLASS_OF[operation]
        for fault in self.faults:
            if kind in fault.operations and fault.armed() and fault.covers(paths):
                if fault.times is not None:
                    fault.times -= 1
                    if not fault.times:
                        self.faults.remove(fault)
                raise OSError(fault.error, os.strerror(fault.error))


class PassThrough:
    """fusepy's operations (raw_fi: ``fi`` is the kernel's fuse_file_info): each checks
    the faults, then does the same on the backing folder."""

    use_ns = True  # times as integer nanoseconds
    flag_nullpath_ok = True  # a file open after its name is gone is served by descriptor

    def __init__(self, backing: str, faults: Faults, ready: Any) -> None:
        self.backing = backing
        self.faults = faults
        self.ready = ready

    def __call__(self, operation: str, *args: Any) -> Any:
        return getattr(self, operation)(*args)

    def real(self, path: str | None) -> str:
        """The backing path of a path in the mount."""
        if path is None:
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        return os.path.join(self.backing, path.lstrip("/"))

    def init(self, path: str) -> None:
        """The kernel has connected: tell the controller."""
        self.ready.write("ready\n")
        self.ready.flush()

    def destroy(self, path: str) -> None:
        """Nothing to release."""

    def getattr(self, path: str | None, fi: Any = None) -> dict[str, int]:
        self.faults.check("getattr", path)
        st = os.fstat(fi.fh) if fi else os.lstat(self.real(path))
        attrs = {name: getattr(st, name) for name in STAT_FIELDS}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def access(self, path: str, mode: int) -> None:
        self.faults.check("access", path)
        if not os.access(self.real(path), mode):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    def readlink(self, path: str) -> str:
        self.faults.check("readlink", path)
        return os.readlink(self.real(path))

    def statfs(self, path: str) -> dict[str, int]:
        self.faults.check("statfs", path)
        st = os.statvfs(self.real(path))
        return {name: getattr(st, name) for name in STATVFS_FIELDS}

    def opendir(self, path: str) -> int:
        self.faults.check("opendir", path)
        return os.open(self.real(path), os.O_RDONLY | os.O_DIRECTORY)

    def readdir(self, path: str | None, fh: int) -> list[str]:
        self.faults.check("readdir", path)
        return [".", "..", *os.listdir(fh)]

    def releasedir(self, path: str | None, fh: int) -> None:
        os.close(fh)

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> None:
        self.faults.check("fsyncdir", path)
        os.fsync(fh)

    def open(self, path: str, fi: Any) -> int:
        self.faults.check("open_write" if fi.flags & WRITE_ACCESS else "open", path)
        fi.fh = os.open(self.real(path), fi.flags)
        return 0

    def create(self, path: str, mode: int, fi: Any) -> int:
        self.faults.check("create", path)
        fi.fh = os.open(self.real(path), fi.flags | os.O_CREAT, mode)
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> None:
        self.faults.check("mknod", path)
        os.mknod(self.real(path), mode, dev)

    def truncate(self, path: str | None, length: int, fi: Any = None) -> None:
        self.faults.check("truncate", path)
        if fi:
            os.ftruncate(fi.fh, length)
        else:
            os.truncate(self.real(path), length)

    def read(self, path: str | None, size: int, offset: int, fi: Any) -> bytes:
        self.faults.check("read", path)
        return os.pread(fi.fh, size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fi: Any) -> int:
        size, delay = self.faults.admit_write(path, len(data))
        if delay:
            time.sleep(delay)
        return os.pwrite(fi.fh, data[:size], offset)

    def flush(self, path: str | None, fi: Any) -> None:
        self.faults.check("flush", path)
        os.close(os.dup(fi.fh))  # what closing one of several descriptors does

    def fsync(self, path: str | None, datasync: int, fi: Any) -> None:
        self.faults.check("fsync", path)
        (os.fdatasync if datasync else os.fsync)(fi.fh)

    def release(self, path: str | None, fi: Any) -> None:
        os.close(fi.fh)

    def rename(self, old: str, new: str) -> None:
        self.faults.check("rename", old, new)
        os.rename(self.real(old), self.real(new))

    def unlink(self, path: str) -> None:
        self.faults.check("unlink", path)
        os.unlink(self.real(path))

    def rmdir(self, path: str) -> None:
        self.faults.check("rmdir", path)
        os.rmdir(self.real(path))

    def mkdir(self, path: str, mode: int) -> None:
        self.faults.check("mkdir", path)
        os.mkdir(self.real(path), mode)

    def symlink(self, path: str, target: str) -> None:
        self.faults.check("symlink", path)
        os.symlink(target, self.real(path))

    def link(self, path: str, existing: str) -> None:
        self.faults.check("link", path, existing)
        os.link(self.real(existing), self.real(path))

    def chmod(self, path: str, mode: int) -> None:
        self.faults.check("chmod", path)
        os.chmod(self.real(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        self.faults.check("chown", path)
        os.chown(self.real(path), uid, gid, follow_symlinks=False)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        self.faults.check("utimens", path)
        if times is None:
            os.utime(self.real(path), follow_symlinks=False)
        else:
            os.utime(self.real(path), ns=times, follow_symlinks=False)


def serve(listener: Listener, faults: Faults) -> None:
    """Answer the controller's commands, one connection at a time, forever."""
    while True:
        connection: Connection
        with listener.accept() as connection:
            try:
                name, argument = connection.recv()
            except (EOFError, OSError):  # the controller went away
                continue
            try:
                connection.send(("ok", faults.command(name, argument)))
            except ValueError as error:
                connection.send(("error", str(error)))


def unmount_when_gone(parent: int, mountpoint: str, control: str) -> None:
    """Once the process that started this one has ended, however it ended, remove the
    folder of the control socket, unmount, and end: nothing outlives its test run."""
    with contextlib.suppress(ProcessLookupError):  # it has ended already
        select.select([os.pidfd_open(parent)], [], [])
    shutil.rmtree(os.path.dirname(control), ignore_errors=True)
    unmount_lazily(mountpoint)  # the file system's loop ends: this process may end with it
    os._exit(0)


def unmount_lazily(mountpoint: str) -> subprocess.CompletedProcess[str]:
    """``fusermount -u -z``: the mount leaves at once, even when busy or dead."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"
    return subprocess.run([tool, "-u", "-z", mountpoint], capture_output=True, text=True,
                          timeout=10)


def main() -> None:
    backing, mountpoint, control, parent = sys.argv[1:]
    from fuse import FUSE  # loads libfuse.so.2

    faults = Faults()
    listener = Listener(control, "AF_UNIX")
    threading.Thread(target=serve, args=(listener, faults), daemon=True).start()
    threading.Thread(target=unmount_when_gone, args=(int(parent), mountpoint, control),
                     daemon=True).start()
    # Names and attributes are never cached, so a fault applies at the next call; an
    # unlinked open file stays readable through its descriptor (no .fuse_hidden files).
    FUSE(PassThrough(os.path.abspath(backing), faults, sys.stdout), mountpoint,
         foreground=True, raw_fi=True, fsname="faultfs", subtype="faultfs", use_ino=True,
         attr_timeout=0, entry_timeout=0, negative_timeout=0, hard_remove=True,
         big_writes=True, max_write=128 * 1024)


if __name__ == "__main__":
    main()
