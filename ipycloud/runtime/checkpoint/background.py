"""The thread that carries an asynchronous checkpoint, at idle CPU priority, and when to
use one.

A training loop keeps the cores busy. A writer competing with it at normal priority takes
CPU time from the middle of its parallel kernels, which can cost the loop more than
writing in the foreground would. At idle priority (Linux ``SCHED_IDLE``) the writer runs
on what the loop leaves idle. Whoever waits for the write gives it normal priority back
first, so waiting for it never takes longer than the write itself. Where the policy is
not available (other systems, a sandbox refusing it), the writer runs at normal priority.
The same holds for the writer process (``writer_process``), which this thread waits for.
Idle priority lasts IDLE_PRIORITY_S at most: where training keeps every core busy (more
ranks than cores, busy DataLoader workers), an idle writer would never run, and a save
taken minutes ago would still be unwritten when the machine goes away.

A background write pays off when a core is left for it: training runs on an accelerator,
or torch's threads leave a core free. When the state is in host memory (training on the
CPU) and torch's threads take every core the process may use, the writer can only run
in the middle of the loop's parallel kernels: writing in the foreground costs the loop
less (``benchmarks/bench_checkpoint.py`` measures both).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ipycloud.runtime.checkpoint.state import map_tensors

IDLE_PRIORITY_S = 2.0  # a background save runs at idle priority this long at most


class BackgroundWriter:
    """A daemon thread that runs the work it is given, one piece at a time, at idle CPU
    priority until someone waits for it.

    The thread is started once and kept, so handing it work costs the caller no thread
    start. In a process forked from its owner, the owner's work is not waited for, and
    new work starts a thread of the fork's own.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        self._owner = os.getpid()
        self._jobs: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._done = threading.Event()
        self._done.set()
        self._hurried = False
        self._idle_id: int | None = None  # the thread's id while it runs at idle priority
        self._thread: threading.Thread | None = None

    def submit(self, work: Callable[[], object]) -> None:
        """Run ``work()`` on the thread; the caller waits for the previous work first."""
        if self._owner != os.getpid():
            self._start()
        with self._lock:
            self._hurried = False
        self._done.clear()
        self._jobs.put(work)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def busy(self) -> bool:
        """Whether work handed to the thread is not finished yet."""
        return self._owner == os.getpid() and not self._done.is_set()

    def hurry(self) -> None:
        """Give the thread normal priority until its current work is done."""
        if self._owner != os.getpid():
            return  # the owner's thread is not in this process
        with self._lock:
            self._hurried = True
            if self._idle_id is not None:
                set_idle(self._idle_id, False)
                self._idle_id = None

    def join(self) -> None:
        """Give the thread normal priority and wait for the work handed to it."""
        if self._owner != os.getpid():
            return
        self.hurry()
        self._done.wait()

    def close(self) -> None:
        """Let the thread end once its work is done."""
        if self._owner == os.getpid() and self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _run(self) -> None:
        native_id = threading.get_native_id()
        while (work := self._jobs.get()) is not None:
            with self._lock:
                if not self._hurried and set_idle(native_id, True):
                    self._idle_id = native_id
            try:
                work()
            finally:
                del work  # waiting for the next, the thread keeps nothing of this one alive
                self._done.set()


def set_idle(native_id: int, idle: bool) -> bool:
    """Put a thread (or a child process) at idle priority, or back to normal; False if
    refused."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    try:
        os.sched_setscheduler(native_id, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def background_pays_off(devices: set[str]) -> bool:
    """Whether a background writer finds a core that training leaves idle: the state has
    tensors on an accelerator (``devices`` from tensor_devices), or torch's threads leave
    a core of this process free."""
    import torch

    if devices - {"cpu"}:
        return True
    return torch.get_num_threads() < _usable_cores()


def tensor_devices(saved: Any) -> set[str]:
    """The device types ("cpu", "cuda", ...) of the tensors in ``saved``."""
    devices: set[str] = set()
    map_tensors(saved, lambda tensor, _path: devices.add(tensor.device.type))
    return devices


def _usable_cores() -> int:
    """The cores this process may run on (its affinity), or the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
