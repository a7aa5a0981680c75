"""multiprocessing's resource tracker, started by the loaders of a spawn (or forkserver)
context, ended with ``fit``.

Under spawn, a loader's queues and events are named semaphores, files in /dev/shm
(``sem.mp-…``) until their objects are collected, and the first one starts the resource
tracker: a child process, ignoring SIGTERM, that removes those files should their
process die first. A kernel shut down with that child waits for it through ipykernel's
whole SIGTERM-then-SIGKILL sequence (about 30 s), then kills it, and what it was to
remove stays in /dev/shm. So ``fit`` stops the tracker where ``fit`` started it, once
the loaders' workers have ended: the tracker removes what is still registered with it,
and multiprocessing starts a new one when one is needed.
"""

from __future__ import annotations

import os
import time
from typing import Any

TRACKER_EXIT_S = 2.0  # at most, for the tracker to end once its pipe is closed


def tracker_running() -> bool:
    """Whether this process has multiprocessing's resource tracker running."""
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker  # its state is not public
    return tracker._fd is not None


def stop_tracker() -> None:
    """End this process's resource tracker: it removes what is still registered with it,
    and ends once no process holds its pipe (at once when the workers are gone; else it
    is left to end with them)."""
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker
    with tracker._lock:
        fd, pid = tracker._fd, tracker._pid
        if fd is None or pid is None:  # none, or one a parent process started
            return
        os.close(fd)
        tracker._fd = tracker._pid = None
    deadline = time.monotonic() + TRACKER_EXIT_S
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)
