"""Kernel deaths as events: noticed on the event loop (the kernel restarter's callbacks),
explained off it (the cgroup counters are files), kept in a bounded list for clients that
poll with the time of the last event they saw. A death out of memory is also an alert to
the user's configured URLs (``runtime.notify``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass

from ipycloud.runtime.monitor.deaths import before_death, explain_death
from ipycloud.runtime.notify import notify
from ipycloud.server.kernel_bodies import Json, death_message
from ipycloud.server.monitor import ServerMonitor

EVENTS_KEPT = 1000


@dataclass(frozen=True)
class KernelDeath:
    """What the event loop knows when the restarter finds a kernel dead."""

    kernel_id: str
    name: str | None  # the kernel spec, e.g. "python3"
    path: str | None  # the notebook or console of its session
    pid: int | None  # the process that died
    returncode: int | None  # Popen's: negative for a signal; None when unknown
    noticed: float  # time.time() when the restarter noticed


class DeathRecorder:
    """Turns kernel deaths into events, each with an increasing id and time."""

    def __init__(self, monitor: ServerMonitor) -> None:
        self._monitor = monitor
        self._events: deque[Json] = deque(maxlen=EVENTS_KEPT)
        self._lock = threading.Lock()
        self._next_id = 1
        self._last_time = 0.0
        self._tasks: set[asyncio.Future[None]] = set()

    def record(self, death: KernelDeath) -> None:
        """Explain ``death`` in an executor thread and keep the event (call on the loop)."""
        task = asyncio.ensure_future(self._record(death))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def since(self, since: float | None) -> list[Json]:
        """The events kept with a time after ``since`` (all without one), oldest first."""
        with self._lock:
            return [event for event in self._events if since is None or event["time"] > since]

    async def _record(self, death: KernelDeath) -> None:
        loop = asyncio.get_running_loop()
        event = await loop.run_in_executor(None, self._explain, death)
        with self._lock:
            # Times only grow, so a client asking for what came after the last event it saw
            # misses none, even when two events are explained out of order.
            stamp = max(time.time(), self._last_time + 1e-6)
            self._events.append({"id": self._next_id, "time": stamp, **event})
            self._next_id += 1
            self._last_time = stamp
        if event["out_of_memory"]:  # reads the user's config: off the loop too
            await loop.run_in_executor(None, notify, "out_of_memory",
                                       "ipycloud: a kernel ran out of memory", event["message"])

    def _explain(self, death: KernelDeath) -> Json:
        oom_kills, ram_peak = self._monitor.probe().memory_counters()
        samples = before_death(self._monitor.history(), death.kernel_id, death.pid,
                               death.noticed)
        explained = explain_death(death.returncode, samples, oom_kills, ram_peak)
        who = (f"the kernel of {death.path}" if death.path else
               f"the kernel {death.kernel_id[:8]} ({death.name or 'unknown kernel'})")
        return {
            "kind": "kernel_died",
            "kernel_id": death.kernel_id,
            "path": death.path,
            "reason": explained.reason,
            "out_of_memory": explained.out_of_memory,
            "ram_limit": explained.ram_limit,
            "ram_peak": explained.ram_peak,
            "message": death_message(who, explained, death.returncode),
        }
