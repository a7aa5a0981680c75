"""The named semaphores of the loaders of a spawn (or forkserver) context, and the
resource tracker that watches them, ended with ``fit``.

Under spawn, a loader's queues and events are named semaphores, files in /dev/shm
(``sem.mp-…``) until their objects are collected, and the first one starts the resource
tracker: a child process, ignoring SIGTERM, that removes those files should their
process die first. A file is needed only until every worker has opened its semaphores by
name, as it starts. A kernel killed outright (out of memory, SIGKILL) has its tracker
killed with its process group, and a kernel shut down waits for the tracker through
ipykernel's whole SIGTERM-then-SIGKILL sequence (about 30 s), then kills it: either way
what it was to remove stays in /dev/shm. So ``fit`` removes its loaders' semaphore files
once their workers have opened them (``opened_by_every_worker``), and at its end those
still there, as their objects would when collected (the objects work on, their
semaphores open); then it stops the tracker where ``fit`` started it: stopped with them
still registered, it would remove them with a warning of leaked semaphores, and their
objects' own removal would fail later. multiprocessing starts a new tracker when one is
needed.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

SHM = "/dev/shm"
TRACKER_EXIT_S = 2.0  # at most, for the tracker to end once its pipe is closed


def tracker_running() -> bool:
    """Whether this process has multiprocessing's resource tracker running."""
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker  # its state is not public
    return tracker._fd is not None


def unlink_semaphores(iterator: Any) -> None:
    """Remove the files of the named semaphores of torch's multi-process ``iterator`` (its
    queues' and its workers' done event's), as their objects do when collected."""
    for finalizer in _removals(_names(_locks(iterator))):
        with contextlib.suppress(OSError):  # removed already
            finalizer()


def still_named(iterator: Any) -> bool:
    """Whether ``iterator`` has named semaphores whose files are still to be removed."""
    return bool(_removals(_names(_locks(iterator))))


def opened_by_every_worker(iterator: Any) -> bool:
    """Whether each live worker of ``iterator`` has opened (mapped) every named semaphore
    it was given: its index queue's, the result queue's and the done event's. False where
    that cannot be seen (no /proc, a worker gone)."""
    shared = _names(_queue_locks(iterator._worker_result_queue)
                    + _event_locks(iterator._workers_done_event))
    for worker, queue in zip(iterator._workers, iterator._index_queues, strict=True):
        try:
            maps = Path(f"/proc/{worker.pid}/maps").read_text()
        except (OSError, TypeError):  # TypeError: not started (no pid)
            return False
        if any(f"{SHM}/sem.{name.lstrip('/')}" not in maps
               for name in shared | _names(_queue_locks(queue))):
            return False
    return True


def _removals(names: set[str]) -> list[Any]:
    """The finalizers still registered that remove the semaphores ``names``."""
    from multiprocessing import synchronize, util

    registry: dict[Any, Any] = getattr(util, "_finalizer_registry")  # noqa: B009 (private)
    cleanup = getattr(synchronize.SemLock, "_cleanup")  # noqa: B009
    return [finalizer for finalizer in list(registry.values())
            if finalizer._callback is cleanup and finalizer._args[0] in names]


def _names(locks: list[Any]) -> set[str]:
    return {lock._semlock.name for lock in locks} - {None}  # None: fork's, unnamed


def _locks(iterator: Any) -> list[Any]:
    locks = []
    for queue in (*iterator._index_queues, iterator._worker_result_queue):
        locks += _queue_locks(queue)
    return locks + _event_locks(iterator._workers_done_event)


def _queue_locks(queue: Any) -> list[Any]:
    return [lock for lock in (queue._rlock, queue._wlock, queue._sem) if lock is not None]


def _event_locks(event: Any) -> list[Any]:
    condition = event._cond
    return [event._flag, condition._lock, condition._sleeping_count, condition._woken_count,
            condition._wait_semaphore]


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
