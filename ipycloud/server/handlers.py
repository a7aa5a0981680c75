"""The request handlers of the routes: each reads what the sampler thread and the kernel
watch already hold, and answers strict JSON (no NaN nor Infinity: ``null``), through
``answer``. The runs routes read files on the runs' own threads, never on the executor the
history route uses. Every verb is ``@tornado.web.authenticated`` and then
authorised by the server's authorizer for the ``ipycloud`` resource, so a server that refuses
unauthenticated access loads them without complaint."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ipycloud.runtime.monitor.route_bodies import parse_since, reading
from ipycloud.runtime.untrusted import strict_dumps
from ipycloud.server.events import DeathRecorder
from ipycloud.server.kernels import KernelWatch
from ipycloud.server.monitor import ServerMonitor
from ipycloud.server.runs import RunFinder, RunsNotReady

T = TypeVar("T")
AUTH_RESOURCE = "ipycloud"
SETTINGS_KEY = "ipycloud"  # the web app's setting holding the Services below


class Services:
    """What the handlers read: the monitor, the kernel watch, the death events and the
    runs."""

    def __init__(self, monitor: ServerMonitor, kernels: KernelWatch, events: DeathRecorder,
                 runs: RunFinder) -> None:
        self.monitor, self.kernels, self.events, self.runs = monitor, kernels, events, runs


class _Handler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def services(self) -> Services:
        services: Services = self.settings[SETTINGS_KEY]
        return services

    def answer(self, body: object, status: int = 200) -> None:
        """Finish with ``body`` as strict JSON."""
        self.set_status(status)
        self.answer_encoded(strict_dumps(body))

    def answer_encoded(self, text: str) -> None:
        """Finish with ``text``, JSON already encoded strictly (strict_dumps)."""
        self.set_header("Content-Type", "application/json")
        self.finish(text)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error as the API's one shape, ``{"message": "<one line>"}``."""
        error = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(error, web.HTTPError) and error.log_message:
            message = error.log_message % error.args
        else:
            message = self._reason
        self.finish(strict_dumps({"message": message}))

    def since(self) -> float | None:
        """The ``since`` parameter as a Unix time; None when absent. One that is not a
        finite number is answered 400."""
        try:
            return parse_since(self.get_query_argument("since", None))
        except ValueError as error:
            raise web.HTTPError(400, "%s", str(error)) from None

    async def from_runs(self, work: Callable[[], T]) -> T:
        """``work`` (an answer of the runs) done on the runs' threads; 503 while the
        server reads the runs' logs for the first time."""
        runs = self.services.runs
        try:
            return await asyncio.get_running_loop().run_in_executor(runs.executor, work)
        except RunsNotReady as error:
            raise web.HTTPError(503, "%s", str(error)) from None


class ReadingHandler(_Handler):
    """GET reading: the latest sample."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        monitor = self.services.monitor
        self.answer(reading(await monitor.current(), monitor.interval))


class HistoryHandler(_Handler):
    """GET history?since=T: the samples kept after T."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        since = self.since()
        monitor = self.services.monitor
        loop = asyncio.get_running_loop()
        # A day of readings is megabytes of JSON: joined off the event loop.
        self.answer_encoded(await loop.run_in_executor(None, monitor.history_json, since))


class KernelsHandler(_Handler):
    """GET kernels: every running kernel with its use of the machine."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        table = await self.services.kernels.table()
        self.answer({"gpu_problem": _gpu_problem(self.services.monitor), "kernels": table})


class KernelHandler(_Handler):
    """GET kernels/<id>: one running kernel."""

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        entry = await self.services.kernels.entry(kernel_id)
        if entry is None:
            self.answer({"message": f"no running kernel has the id {kernel_id!r}"}, 404)
            return
        self.answer(entry)


class EventsHandler(_Handler):
    """GET events?since=T: kernel deaths after T."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.answer({"events": self.services.events.since(self.since())})


class RunsHandler(_Handler):
    """GET runs: the runs of the server's kernels and under its root folder."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        runs, kernels = self.services.runs, self.services.kernels.kernel_ids()
        ready = runs.ready_json(kernels)  # a view there: answered at once, off any thread
        self.answer_encoded(ready if ready is not None
                            else await self.from_runs(lambda: runs.runs_json(kernels)))


class RunHandler(_Handler):
    """GET runs/<id>?since=T: one run and its records after T."""

    @web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        since = self.since()
        runs, kernels = self.services.runs, self.services.kernels.kernel_ids()
        body = await self.from_runs(lambda: runs.run_json(run_id, kernels, since))
        if body is None:
            self.answer({"message": f"no run of this server has the id {run_id!r}: GET runs "
                                    "lists them"}, 404)
            return
        self.answer_encoded(body)


def _gpu_problem(monitor: ServerMonitor) -> str | None:
    latest = monitor.latest()
    return None if latest is None else latest.gpu_problem
