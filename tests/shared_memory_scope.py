"""What a run leaves in /dev/shm, told apart from what the rest of the machine does there.

As root, this process moves to a mount namespace of its own (``unshare(CLONE_NEWNS)``),
and each run gets a fresh tmpfs over /dev/shm in it: every process the run starts
(forked from this one, or from a helper started after ``__enter__``) shares it, and
whatever is in it after the run (torch's shared tensors, multiprocessing's semaphores) is
the run's. Elsewhere (no right to mount) a run's files are those new in the machine's
/dev/shm that no live process holds, which another test starting at the same moment can
blur.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 1 << 14, 1 << 18
MNT_DETACH = 2
SHM = "/dev/shm"


class SharedMemoryScope:
    """A context manager; ``run()`` scopes one run, and its ``left()`` (after it) names
    the files the run left in /dev/shm."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._original: int | None = None  # this process's first mount namespace
        self.private = False

    def __enter__(self) -> SharedMemoryScope:
        original = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        if self._libc.unshare(CLONE_NEWNS) != 0:
            os.close(original)
            return self
        self._original = original
        # mounts made here stay here, never reaching the machine's namespace
        self._call("mount", b"none", b"/", None, MS_REC | MS_PRIVATE, None)
        self.private = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._original is not None:
            self._call("setns", self._original, CLONE_NEWNS)
            os.close(self._original)
            self._original, self.private = None, False

    @contextlib.contextmanager
    def run(self) -> Iterator[RunFiles]:
        """One run, between entering and leaving: a fresh /dev/shm where private."""
        files = RunFiles(self.private, set() if self.private else set(os.listdir(SHM)))
        if self.private:
            self._call("mount", b"tmpfs", SHM.encode(), b"tmpfs", 0, b"size=2g,mode=1777")
        try:
            yield files
        finally:
            files.found = files.new_files()
            if self.private:
                self._call("umount2", SHM.encode(), MNT_DETACH)

    def _call(self, name: str, *arguments: object) -> None:
        if getattr(self._libc, name)(*arguments) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"{name} failed: {os.strerror(error)}")


class RunFiles:
    """The files one run left in /dev/shm (``found``, once the run's scope is over)."""

    def __init__(self, private: bool, before: set[str]) -> None:
        self.private, self.before = private, before
        self.found: list[str] = []

    def new_files(self) -> list[str]:
        new = set(os.listdir(SHM)) - self.before
        return sorted(new if self.private else _held_by_nobody(new))


def _held_by_nobody(names: set[str]) -> set[str]:
    """Those of ``names`` (in /dev/shm) that no live process has open or mapped: left
    behind (those another process holds are its own, not the run's)."""
    held: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            held.update(line.rsplit(f"{SHM}/", 1)[-1].split(" ")[0] for line in
                        Path(f"/proc/{pid}/maps").read_text().splitlines()
                        if f"{SHM}/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    held.add(os.readlink(f"/proc/{pid}/fd/{fd}").rsplit(f"{SHM}/", 1)[-1])
    return {name for name in names if name not in held}
