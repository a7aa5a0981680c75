"""Storage that fails as Colab's Drive mount does: a real FUSE mount that answers chosen
operations with ENOTCONN, EIO, ENOSPC or EROFS, writes slowly, vanishes and comes back;
and a small tmpfs for a disk that is really full.

A pytest plugin (tests/conftest.py lists it in ``pytest_plugins``) with two fixtures:

- ``faulty_mount``: a ``FaultyMount`` whose ``path`` ("My Drive") mirrors the folder
  ``backing``. ``fail(errno.EIO, ops="write")``, ``slow(0.1)``, ``heal()``, ``vanish()``,
  ``unmount()``, ``come_back()``; ``calls()`` lists the file operations it served.
- ``small_tmpfs``: a function that mounts a tmpfs of the given size and returns its path;
  ``read_only_folder`` and ``full_folder`` are two such mounts ready made.

A test that uses one of them is marked ``fuse`` or ``mounts`` and is skipped, with the
reason, where the machine lacks what it needs; one that mounts with ``mounted(backing,
mountpoint)`` itself carries ``@pytest.mark.fuse``. Every mount is gone after the test,
however it ends. The file system runs in its own process: tests/faultfs_daemon.py.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import functools
import importlib.util
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

import pytest
from faultfs_daemon import OPERATIONS, Fault, unmount_lazily

DAEMON = Path(__file__).with_name("faultfs_daemon.py")
TIMEOUT_S = 10.0  # for mounting, unmounting, a command and a daemon to end
# The classes of operations that change something: a read-only mount refuses these.
CHANGING = frozenset({"create", "write", "rename", "unlink", "mkdir", "link", "setattr"})


class FaultyMount:
    """A faultfs mount at ``path`` mirroring ``backing``, and the process serving it.

    Each method returns once the file system has applied it: the next operation through
    the mount sees the change. Operation classes (``ops``): stat (stat, access, readlink,
    statvfs, and the lookup of every path), listdir, open (to read), create (create, or
    open to write or truncate, truncate), read, write, flush (close), fsync (files and
    folders), rename, unlink (and rmdir), mkdir, link (symlink, hard link), setattr
    (chmod, chown, utime).
    """

    def __init__(self, backing: Path, path: Path) -> None:
        self.backing = backing
        self.path = path
        self._control_dir = Path(tempfile.mkdtemp(prefix="faultfs-"))
        self._control = str(self._control_dir / "control")
        self._log = self._control_dir / "daemon.log"
        self._daemon: subprocess.Popen[str] | None = None

    def fail(self, error: int, ops: str | Collection[str] | None = None, *,
             path: str | None = None, after_bytes: int | None = None,
             times: int | None = None) -> None:
        """Answer the operations of the classes ``ops`` (all when None) with ``error``.

        path: only on paths (relative to the mount) matching this fnmatch pattern, e.g.
        ``"ckpt/*.tmp"``. after_bytes: only once that many more bytes have been written
        (a write crossing the mark is cut short there when "write" is in ``ops``). times:
        only the next that many matching calls. Faults add up; ``heal`` ends them all.
        """
        classes = frozenset(OPERATIONS if ops is None else [ops] if isinstance(ops, str)
                            else ops)
        if error not in errno.errorcode:
            raise ValueError(f"error must be an errno such as errno.EIO, not {error!r}")
        if unknown := sorted(classes - OPERATIONS):
            raise ValueError(f"unknown operation class {', '.join(map(repr, unknown))}; "
                             f"choose from {', '.join(sorted(OPERATIONS))}")
        if after_bytes is not None and after_bytes < 0:
            raise ValueError(f"after_bytes must be 0 or more, not {after_bytes}")
        if times is not None and times < 1:
            raise ValueError(f"times must be 1 or more, not {times}")
        self._command("fail", Fault(error, classes, path, after_bytes, times))

    def slow(self, seconds_per_write: float) -> None:
        """Wait this long before each write request (the kernel sends at most 128 KiB
        in one)."""
        if seconds_per_write < 0:
            raise ValueError(f"seconds_per_write must be >= 0, not {seconds_per_write}")
        self._command("slow", seconds_per_write)

    def heal(self) -> None:
        """End every fault and slowness."""
        self._command("heal")

    def calls(self) -> list[tuple[str, str | None]]:
        """The FUSE operations served since the last call (the last 100 000), each as
        (operation, path in the mount); the path of an open file with no name is None."""
        calls: list[tuple[str, str | None]] = self._command("calls")
        return calls

    def vanish(self) -> None:
        """Kill the file system's process: as on a dead Drive mount, every access to the
        mount (and through descriptors open on it) fails with ENOTCONN, "Transport
        endpoint is not connected"."""
        if self._daemon is not None:
            self._daemon.kill()
            self._daemon.wait(TIMEOUT_S)  # its end closed /dev/fuse: the kernel gave up
            if self._daemon.stdout is not None:
                self._daemon.stdout.close()
            self._daemon = None

    def unmount(self) -> None:
        """Kill the file system and unmount it: the mount point is a bare folder of the
        disk below, as while a mount is made again (``come_back()`` mounts again)."""
        self.vanish()
        _unmount(self.path)

    def come_back(self) -> None:
        """Mount again on the same mount point, the backing data as it was, no faults."""
        self.vanish()
        _unmount(self.path)
        self.start()

    def start(self) -> None:
        """Mount; return once the kernel talks to the file system."""
        if self._daemon is not None:
            raise RuntimeError(f"faultfs is already mounted at {self.path}")
        self.path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._control)
        with open(self._log, "w") as log:
            self._daemon = subprocess.Popen(
                [sys.executable, str(DAEMON), str(self.backing), str(self.path),
                 self._control, str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self._daemon.stdout is not None
        readable, _, _ = select.select([self._daemon.stdout], [], [], TIMEOUT_S)
        if not readable or self._daemon.stdout.readline() != "ready\n":
            self.vanish()
            _unmount(self.path)
            inside = sorted(str(path.relative_to(self.path)) for path in self.path.rglob("*"))
            raise RuntimeError(f"faultfs could not mount {self.path} (holding {inside}): "
                               f"{self._log_tail()}")

    def close(self) -> None:
        """Stop the file system and unmount, whatever state it is in."""
        self.vanish()
        _unmount(self.path)
        shutil.rmtree(self._control_dir, ignore_errors=True)

    def _command(self, name: str, argument: Any = None) -> Any:
        if self._daemon is None:
            raise RuntimeError(f"faultfs has vanished from {self.path}; call come_back() first")
        with Client(self._control, "AF_UNIX") as connection:
            connection.send((name, argument))
            if not connection.poll(TIMEOUT_S):
                raise TimeoutError(f"faultfs did not answer {name!r} in {TIMEOUT_S} s: "
                                   f"{self._log_tail()}")
            status, answer = connection.recv()
        if status != "ok":
            raise RuntimeError(f"faultfs refused {name!r}: {answer}")
        return answer

    def _log_tail(self) -> str:
        text = self._log.read_text(errors="replace").strip() if self._log.exists() else ""
        return text[-2000:] or "(nothing in its log)"


@contextlib.contextmanager
def mounted(backing: Path, mountpoint: Path) -> Iterator[FaultyMount]:
    """A faultfs mount of ``backing`` (created if missing) at ``mountpoint`` (an empty or
    missing folder) for the time of the ``with`` block."""
    backing.mkdir(parents=True, exist_ok=True)
    mount = FaultyMount(backing, mountpoint)
    try:
        mount.start()
        yield mount
    finally:
        mount.close()


def mount_points() -> set[Path]:
    """Every mount point of this process's mount namespace."""
    with open("/proc/self/mountinfo") as table:
        fields = [line.split(" ")[4] for line in table]
    # spaces, tabs, newlines and backslashes in a path are written as octal escapes
    return {Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field))
            for field in fields}


def _unmount(path: Path) -> None:
    """Unmount ``path`` if it is a mount point, lazily (a busy mount goes too)."""
    if path not in mount_points():
        return
    done = unmount_lazily(str(path))
    if path in mount_points():
        raise RuntimeError(f"could not unmount {path}: {done.stderr.strip()}")


@functools.cache
def fuse_missing() -> str | None:
    """Why faultfs cannot mount here, or None if it can."""
    if not sys.platform.startswith("linux"):
        return "faultfs needs Linux"
    if not os.path.exists("/dev/fuse"):
        return "faultfs needs /dev/fuse (in a container: --device /dev/fuse)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "faultfs needs read and write access to /dev/fuse"
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "faultfs needs fusermount: run scripts/test_fuse.sh (apt-get install fuse3)"
    if not (os.environ.get("FUSE_LIBRARY_PATH") or ctypes.util.find_library("fuse")):
        return "faultfs needs libfuse.so.2: run scripts/test_fuse.sh (apt-get install libfuse2)"
    if importlib.util.find_spec("fuse") is None:
        return "faultfs needs fusepy: pip install -e '.[test]'"
    return None


@functools.cache
def as_root() -> list[str] | None:
    """The prefix that runs a command as root ([] when this is root), or None."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True,
                                               timeout=TIMEOUT_S).returncode == 0:
        return ["sudo", "-n"]
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that mount: before ``-m`` selects by marker."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "faulty_mount" in fixtures:
            item.add_marker("fuse")
        if "small_tmpfs" in fixtures:
            item.add_marker("mounts")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip, with the reason, a test whose mounts this machine cannot make."""
    if item.get_closest_marker("fuse") and (reason := fuse_missing()):
        pytest.skip(reason)
    if item.get_closest_marker("mounts") and as_root() is None:
        pytest.skip("mounting a tmpfs needs root or passwordless sudo")


@pytest.fixture
def faulty_mount(tmp_path: Path) -> Iterator[FaultyMount]:
    """A live faultfs mount at tmp_path/"My Drive" mirroring tmp_path/"backing"."""
    with mounted(tmp_path / "backing", tmp_path / "My Drive") as mount:
        yield mount


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``small_tmpfs(size, read_only=False)`` mounts a tmpfs of ``size`` (bytes, or a
    number with k, m or g) owned by this user, and returns its path; each is unmounted
    after the test."""
    root = as_root()
    assert root is not None, "the mounts marker skips where tmpfs cannot be mounted"
    mounted_here: list[Path] = []

    def mount(size: int | str, read_only: bool = False) -> Path:
        if not re.fullmatch(r"[1-9][0-9]*[kmg]?", str(size), re.IGNORECASE):
            raise ValueError(f"size must be a number of bytes, or one with k, m or g "
                             f"(e.g. '1m'), not {size!r}")
        target = tmp_path / f"tmpfs {len(mounted_here)}"
        target.mkdir()
        options = (f"size={size},uid={os.getuid()},gid={os.getgid()},mode=0700"
                   + (",ro" if read_only else ""))
        subprocess.run([*root, "mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                       check=True, capture_output=True, timeout=TIMEOUT_S)
        mounted_here.append(target)
        return target

    yield mount
    for target in reversed(mounted_here):
        subprocess.run([*root, "umount", "--lazy", str(target)], check=True,
                       capture_output=True, timeout=TIMEOUT_S)


@pytest.fixture
def read_only_folder(small_tmpfs: Callable[..., Path]) -> Path:
    """An empty folder on a read-only file system."""
    return small_tmpfs("1m", read_only=True)


@pytest.fixture
def full_folder(small_tmpfs: Callable[..., Path]) -> Path:
    """A folder on a file system of 64 KiB, where a larger file finds no space."""
    return small_tmpfs("64k")
