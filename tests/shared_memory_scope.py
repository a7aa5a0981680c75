"""What a run leaves in /dev/shm, told apart from what the rest of the machine does there.

As root, a holder process (``unshare --mount``, doing nothing else) keeps a mount
namespace of its own, and each run gets a fresh tmpfs over /dev/shm in it. The run's
processes are started in that namespace (``enter`` as their ``preexec_fn``; what they
start inherits it), and whatever is in it after the run (torch's shared tensors,
multiprocessing's semaphores) is the run's. This process never changes namespace, so its
threads all see the machine's mounts. Elsewhere (no right to mount) a run's files are
those new in the machine's /dev/shm that no live process holds, which another test
starting at the same moment can blur.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

CLONE_NEWNS = 0x00020000
SHM = "/dev/shm"
HOLDER_START_S = 10.0


class SharedMemoryScope:
    """A context manager; ``run()`` scopes one run, and its ``found`` (after it) names
    the files the run left in /dev/shm. ``preexec_fn``: what a process of a run is started
    with (None where the scope is not private)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._holder: subprocess.Popen[bytes] | None = None
        self.preexec_fn: Callable[[], None] | None = None

    @property
    def private(self) -> bool:
        return self._holder is not None

    def __enter__(self) -> SharedMemoryScope:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            return self
        holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                   "sleep", "infinity"], stderr=subprocess.DEVNULL)
        if _namespace_held(holder):
            self._holder, self.preexec_fn = holder, self.enter
        else:
            _end(holder)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._holder is not None:
            _end(self._holder)
            self._holder, self.preexec_fn = None, None

    def enter(self) -> None:
        """Move the calling process (a child between fork and exec) to the namespace."""
        assert self._holder is not None
        namespace = os.open(f"/proc/{self._holder.pid}/ns/mnt", os.O_RDONLY)
        if self._libc.setns(namespace, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns failed")
        os.close(namespace)

    @contextlib.contextmanager
    def run(self) -> Iterator[RunFiles]:
        """One run: a fresh /dev/shm where private."""
        if self._holder is None:
            files = RunFiles(Path(SHM), False, set(os.listdir(SHM)))
        else:
            self._in_namespace("mount", "-t", "tmpfs", "-o", "size=2g,mode=1777", "tmpfs", SHM)
            files = RunFiles(Path(f"/proc/{self._holder.pid}/root{SHM}"), True, set())
        try:
            yield files
        finally:
            files.found = files.new_files()
            if self._holder is not None:
                self._in_namespace("umount", "--lazy", SHM)

    def _in_namespace(self, *command: str) -> None:
        subprocess.run(command, preexec_fn=self.enter, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _namespace_held(holder: subprocess.Popen[bytes]) -> bool:
    """Whether ``holder`` reached its own namespace (its ``sleep``) before it ended."""
    ours = os.readlink("/proc/self/ns/mnt")
    deadline = time.monotonic() + HOLDER_START_S
    while holder.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if (os.readlink(f"/proc/{holder.pid}/exe").endswith("/sleep")
                    and os.readlink(f"/proc/{holder.pid}/ns/mnt") != ours):
                return True
        time.sleep(0.01)
    return False


def _end(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()


class RunFiles:
    """The files one run left in /dev/shm (``found``, once the run's scope is over), seen
    at ``folder`` (the namespace's /dev/shm, reached through its holder, where private)."""

    def __init__(self, folder: Path, private: bool, before: set[str]) -> None:
        self.folder, self.private, self.before = folder, private, before
        self.found: list[str] = []

    def new_files(self) -> list[str]:
        new = set(os.listdir(self.folder)) - self.before
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
