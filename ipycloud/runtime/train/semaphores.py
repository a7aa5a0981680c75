"""The named semaphores of the loaders of a spawn (or forkserver) context, and the
resource tracker that watches them, ended with ``fit``.

Under spawn, a loader's queues and events are named semaphores, files in /dev/shm
(``sem.mp-…``) until their objects are collected, and the first one starts the resource
tracker: a child process, ignoring SIGTERM, that removes those files should their
process die first. A kernel shut down with that child waits for it through ipykernel's
whole SIGTERM-then-SIGKILL sequence (about 30 s), then kills it, and what it was to
remove stays in /dev/shm. So ``fit`` removes its loaders' semaphore files as it ends
their workers (as their objects would when collected; the objects work on, their
semaphores open), then stops the tracker where ``fit`` started it: stopped with them
still registered, it would remove them with a warning of leaked semaphores, and their
objects' own removal would fail later. multiprocessing starts a new tracker when one is
needed.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

TRACKER_EXIT_S = 2.0  # at most, for the tracker to end once its pipe is closed


def tracker_running() -> bool:
    """Whether this process has multiprocessing's resource tracker running."""
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker  # its state is not public
    return tracker._fd is not None


def unlink_semaphores(iterator: Any) -> None:
    """Remove the files of the named semaphores of torch's multi-process ``iterator`` (its
    queues' and its workers' done event's), as their objects do when collected."""
    from multiprocessing import synchronize, util

    names = {lock._semlock.name for lock in _locks(iterator)} - {None}  # None: fork's
    registry: dict[Any, Any] = getattr(util, "_finalizer_registry")  # noqa: B009 (private)
    cleanup = getattr(synchronize.SemLock, "_cleanup")  # noqa: B009
    for finalizer in list(registry.values()):
        if finalizer._callback is cleanup and finalizer._args[0] in names:
            with contextlib.suppress(OSError):  # removed already
                finalizer()


def _locks(iterator: Any) -> list[Any]:
    locks = []
    for queue in (*iterator._index_queues, iterator._worker_result_queue):
        locks += [queue._rlock, queue._wlock, queue._sem]
    event = iterator._workers_done_event
    condition = event._cond
    locks += [event._flag, condition._lock, condition._sleeping_count,
              condition._woken_count, condition._wait_semaphore]
    return [lock for lock in locks if lock is not None]


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
