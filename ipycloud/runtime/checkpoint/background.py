"""The thread that writes an asynchronous checkpoint, at idle CPU priority, and when to use it.

A training loop keeps the cores busy. A writer competing with it at normal priority takes
CPU time from the middle of its parallel kernels, which can cost the loop more than
writing in the foreground would. At idle priority (Linux ``SCHED_IDLE``) the writer runs
on what the loop leaves idle. Whoever waits for the write gives the thread normal
priority back first, so waiting for it never takes longer than the write itself. Where
the policy is not available (other systems, a sandbox refusing it), the thread runs at
normal priority.

A background write pays off when a core is left for it: training runs on an accelerator,
or torch's threads leave a core free. When the state is in host memory (training on the
CPU) and torch's threads take every core the process may use, the writer can only run
in the middle of the loop's parallel kernels: writing in the foreground costs the loop
less (``benchmarks/bench_checkpoint.py`` measures both).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ipycloud.runtime.checkpoint.state import map_tensors


class BackgroundWrite:
    """Runs ``work()`` on a daemon thread named ``name``, at idle priority until joined."""

    def __init__(self, work: Callable[[], object], name: str) -> None:
        self._work = work
        self._lock = threading.Lock()
        self._joining = False
        self._idle_id: int | None = None  # the thread's id while it runs at idle priority
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        native_id = threading.get_native_id()
        with self._lock:
            if not self._joining and _set_idle(native_id, True):
                self._idle_id = native_id
        try:
            self._work()
        finally:
            with self._lock:  # the id can be reused once the thread is gone
                self._idle_id = None

    def join(self) -> None:
        """Give the thread normal priority and wait for it to finish."""
        with self._lock:
            self._joining = True
            if self._idle_id is not None:
                _set_idle(self._idle_id, False)
                self._idle_id = None
        self._thread.join()


def _set_idle(native_id: int, idle: bool) -> bool:
    """Put a thread of this process at idle priority, or back to normal; False if refused."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    try:
        os.sched_setscheduler(native_id, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def background_pays_off(saved: Any) -> bool:
    """Whether a background writer finds a core that training leaves idle: some tensor of
    ``saved`` lives on an accelerator, or torch's threads leave a core of this process free."""
    import torch

    devices: set[str] = set()
    map_tensors(saved, lambda tensor, _path: devices.add(tensor.device.type))
    if devices - {"cpu"}:
        return True
    return torch.get_num_threads() < _usable_cores()


def _usable_cores() -> int:
    """The cores this process may run on (its affinity), or the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
