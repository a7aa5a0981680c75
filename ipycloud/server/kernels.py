"""The server's kernels, followed from the event loop: their PIDs for the sampler, their
sessions' paths, and a callback on each kernel's restarter that notices its death.

jupyter_client's restarter polls each kernel (every ``KernelRestarter.time_to_dead``
seconds) and, finding its process gone, calls the ``restart`` callbacks before restarting
it, or the ``dead`` ones when it gives up; at that moment the dead process's exit status is
still on the kernel manager's provisioner. Everything here only reads attributes of the
kernel and session managers: no file, no process table, nothing that blocks the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

from tornado.ioloop import PeriodicCallback

from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.monitor.host import HostSample
from ipycloud.server.events import DeathRecorder, KernelDeath
from ipycloud.server.kernel_bodies import Json, kernel
from ipycloud.server.monitor import ServerMonitor

logger = logging.getLogger(__name__)

GATEWAY_PROBLEM = "the kernel runs elsewhere (gateway): no local process"
NO_PID_PROBLEM = "the kernel has no local process: its provisioner gives no PID"


class KernelWatch:
    """Follows the kernels of one server's kernel manager: at each sampler interval it
    refreshes the PIDs and session paths and follows new kernels' restarters."""

    def __init__(self, kernel_manager: Any, session_manager: Any, monitor: ServerMonitor,
                 recorder: DeathRecorder, gateway: bool) -> None:
        self._kernels = kernel_manager
        self._session_manager = session_manager
        self._monitor = monitor
        self._recorder = recorder
        self._gateway = gateway
        self._followed: set[str] = set()
        self._seen: set[str] = set()  # every kernel since the server started
        self._sessions: dict[str, Json] = {}  # by kernel id, as of the last refresh
        self._timer = PeriodicCallback(self._tick, monitor.interval * 1000)
        self._syncing: asyncio.Future[None] | None = None

    def start(self, io_loop: Any) -> None:
        """Follow the kernels on ``io_loop`` (a tornado IOLoop, running or about to) until
        the monitor stops."""
        io_loop.add_callback(self._timer.start)

    async def sync(self) -> None:
        """Refresh the sessions, follow new kernels, and hand the PIDs to the sampler."""
        self._sessions = await self._session_models()
        ids = list(self._kernels.list_kernel_ids())
        self._followed &= set(ids)
        self._seen.update(ids)
        pids = {}
        for kernel_id in ids:
            manager = self._manager(kernel_id)
            if manager is None:
                continue
            self._follow(kernel_id, manager)
            pid = _pid(manager)
            if pid is not None:
                pids[kernel_id] = pid
        self._monitor.watched = pids

    def kernel_ids(self) -> frozenset[str]:
        """The ids of the server's kernels: those running and those that ran since the
        server started (a run's kernel may have died; its run is still the server's)."""
        return frozenset(self._seen.union(self._kernels.list_kernel_ids()))

    async def table(self) -> list[Json]:
        """The entry of each running kernel (see README.md, GET kernels)."""
        await self.sync()
        sample = self._monitor.latest()
        entries = (self._entry(kernel_id, sample) for kernel_id in self._kernels.list_kernel_ids())
        return [entry for entry in entries if entry is not None]

    async def entry(self, kernel_id: str) -> Json | None:
        """One kernel's entry; None when no running kernel has this id."""
        if kernel_id not in self._kernels.list_kernel_ids():
            return None
        await self.sync()
        return self._entry(kernel_id, self._monitor.latest())

    def _entry(self, kernel_id: str, sample: HostSample | None) -> Json | None:
        manager = self._manager(kernel_id)
        if manager is None:
            return None
        pid = _pid(manager)
        tree = None if sample is None or pid is None else sample.watched.get(kernel_id)
        if tree is not None and tree.pid != pid:  # restarted since: not measured yet
            tree = None
        if pid is None:
            problem: str | None = GATEWAY_PROBLEM if self._gateway else NO_PID_PROBLEM
        elif tree is not None and not tree.alive:
            problem = f"the kernel's process {pid} has ended"
        else:
            problem = None
        return kernel(kernel_id, getattr(manager, "kernel_name", None),
                      getattr(manager, "execution_state", None), self._sessions.get(kernel_id),
                      pid, problem, tree)

    def _tick(self) -> None:
        if not self._monitor.running:
            self._timer.stop()
        elif self._syncing is None or self._syncing.done():
            self._syncing = asyncio.ensure_future(self._sync_logged())

    async def _sync_logged(self) -> None:
        try:
            await self.sync()
        except Exception as error:  # a manager in a state not foreseen: try again next tick
            logger.warning("ipycloud could not follow the kernels: %s", describe_error(error))

    async def _session_models(self) -> dict[str, Json]:
        models: dict[str, Json] = {}
        for session in await self._session_manager.list_sessions():
            kernel_id = (session.get("kernel") or {}).get("id")
            if kernel_id is not None:
                models.setdefault(kernel_id, session)
        return models

    def _manager(self, kernel_id: str) -> Any:
        try:
            return self._kernels.get_kernel(kernel_id)
        except KeyError:  # ended since it was listed
            return None

    def _follow(self, kernel_id: str, manager: Any) -> None:
        """Put the death callbacks on the kernel's restarter, once it has one (a kernel
        still starting, or one without automatic restarts, has none yet)."""
        if kernel_id in self._followed or getattr(manager, "_restarter", None) is None:
            return
        for event in ("restart", "dead"):
            manager.add_restart_callback(partial(self._died, kernel_id, manager), event)
        self._followed.add(kernel_id)

    def _died(self, kernel_id: str, manager: Any) -> None:
        provisioner = getattr(manager, "provisioner", None)
        session = self._sessions.get(kernel_id) or {}
        self._recorder.record(KernelDeath(
            kernel_id=kernel_id,
            name=getattr(manager, "kernel_name", None),
            path=session.get("path"),
            pid=getattr(provisioner, "pid", None),
            returncode=getattr(getattr(provisioner, "process", None), "returncode", None),
            noticed=time.time(),
        ))


def _pid(manager: Any) -> int | None:
    """The local process of a kernel (jupyter_client's local provisioner), else None."""
    pid = getattr(getattr(manager, "provisioner", None), "pid", None)
    return pid if isinstance(pid, int) else None
