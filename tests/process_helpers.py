"""Looking at processes from tests: whether one has ended, what a process holds open."""

from __future__ import annotations

import contextlib
import os

import psutil


def ended(process: psutil.Process) -> bool:
    """Whether it has ended (a zombie has: it only waits for its parent to reap it)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def descriptors_of_this_process() -> list[str]:
    """What each open descriptor of this process refers to."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return targets


def descriptors_of_a_fork() -> list[str]:
    """What each open descriptor of a child forked now refers to (as a DataLoader worker
    or a ``launch`` rank would find them)."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(writer, "\n".join(descriptors_of_this_process()).encode())
        os._exit(0)
    os.close(writer)
    inherited = os.read(reader, 1 << 16).decode().splitlines()
    os.close(reader)
    os.waitpid(child, 0)
    return inherited
