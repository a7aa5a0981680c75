"""Benchmark: what ipycloud's Jupyter server extension and lab extension cost, against
jupyter-resource-usage measured in the same run on the same server.

Goals:

1. One sampler serves every client: the CPU time the server's ``ipycloud-sampler`` thread
   spends per reading is the same (within 20%) with 20 clients polling as with 1.
2. The server's event loop never lags 10 ms or more while 20 ipycloud clients poll.

Measured beside them, without goals of their own: the latency (p50, p99) of
``GET ipycloud/api/history?since=``, ``reading`` and ``kernels`` against
jupyter-resource-usage's ``GET api/metrics/v1``; the CPU time of the server process; and in
a browser, what JupyterLab's page spends on ipycloud's status bar item with its panel open,
against the same page without it and with jupyter-resource-usage's status bar item.

Server. A real ``jupyter server`` subprocess (tests/jupyter_process.py) runs ipycloud's
extension, jupyter-resource-usage with its defaults (RAM only; its Prometheus callback reads
every process's memory once a second on the event loop) and this file, loaded as a small
extension of its own. Two idle kernels with notebook sessions run in it, so the kernels
table has rows. Clients are threads of this process, each with its own keep-alive
connection, polling about once a second (each period drawn from 0.95-1.05 s, as browsers'
polls drift, so no client keeps in step with the server's own once-a-second work): an
ipycloud client asks for ``history?since=<its last reading>``, ``reading`` and ``kernels``
one after the other (a lab page with the panel open asks for history, kernels and events
every 2 s); a jupyter-resource-usage client asks for ``api/metrics/v1``. A latency is the
time from sending a request to reading its whole answer, measured in this process (its
polling threads and the GIL included). The conditions (idle; each extension with 1 and with
20 clients) run ``phase_s`` seconds each, in ABCDE EDCBA order over the rounds, so drift
hits all alike.

CPU: the run time of each of the server's threads, in ns, from
``/proc/<pid>/task/<tid>/schedstat``, read every ``chunk_s`` seconds. The sampler thread is
found by its Python name (Python 3.11 does not give it to the OS thread), which this file's
extension reports with each thread's native id; the event loop runs on the main thread. CPU
is in percent of one core: the median of the chunks, with their minimum and maximum. The
sampler's cost is also given per reading, the readings of each chunk counted by their times
(from ``history`` at the end), since a chunk of 4 s holds 4 or 5 of them.

Loop lag: only during the lag phases, this file's extension runs a task on the server's
event loop that sleeps LAG_PERIOD_S at a time and records how much later than asked it woke
up. A lag includes everything else the loop ran meanwhile (both extensions' handlers,
tornado's HTTP work, kernel messages, jupyter-resource-usage's Prometheus callback) and any
time the OS did not run the loop's thread: the idle phase shows that part on this machine.
A second server, idle, gives the same figure with jupyter-resource-usage's
``track_cpu_percent`` (what it needs to show CPU), whose callback then measures each
process's CPU over 50 ms on the loop.

Browser: ``jupyter lab`` in another server, Debian's headless Chromium through Playwright,
a fresh browser for each condition on ``/lab?reset``. A condition's extensions are turned
off in that server's own ``labconfig/page_config.json`` (what ``jupyter labextension
disable`` writes), which it reads at each page load. Once the page is ready (the panel open
and showing the kernel's notebook; the other extension's item showing) and has settled,
``Performance.getMetrics`` over a CDP session with thread ticks (CPU time of the renderer's
main thread, not wall time) gives ScriptDuration and TaskDuration every ``window_s``
seconds for ``browser_s`` seconds: ms per minute, the median of the windows with their
minimum and maximum. Each extension polls at its default rate; its requests are counted.

Run: ``python benchmarks/bench_server.py [--quick]`` (about 6 minutes, or 1.5); results go to
``benchmarks/results/server.json``. jupyter-resource-usage is not a dependency of ipycloud:
``pip install jupyter-resource-usage`` to compare; without it its figures are left out. Other
work on the machine is recorded: the load average, and the CPU other processes used during
the server's CPU phases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import http.client
import importlib.util
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from figures import percentile, write_results
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from jupyter_process import JupyterProcess  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "server.json"
EXTENSION = Path(__file__).stem  # this file, loaded into the measured server
CLIENTS = 20
LAG_PERIOD_S = 0.005
LAG_GOAL_MS = 10.0
SAMPLER_GOAL_RATIO = 1.2  # the same: 20 clients' sampler CPU within 20% of 1 client's
SAMPLER_THREAD = "ipycloud-sampler"
SHARED_PERCENT = 10.0  # other processes' CPU, % of one core, that makes the machine shared
RESOURCE_USAGE_LAB = "@jupyter-server/resource-usage"
# jupyter-resource-usage's setting to show CPU too: its Prometheus callback then measures
# each process's CPU over 50 ms, on the event loop
RESOURCE_USAGE_CPU = "--ResourceUseDisplay.track_cpu_percent=True"


@dataclass(frozen=True)
class Plan:
    """How long each part runs, in seconds."""

    warm_s: float  # each extension's routes are polled this long before measuring
    phase_s: float  # one condition in one round
    rounds: int
    chunk_s: float  # CPU is read this often
    lag_s: float  # one lag phase
    browser_s: float  # one browser condition's measured window
    window_s: float
    settle_s: float  # after the page is ready, before measuring


FULL = Plan(warm_s=3, phase_s=8, rounds=2, chunk_s=4, lag_s=8, browser_s=60, window_s=10,
            settle_s=5)
QUICK = Plan(warm_s=1, phase_s=3, rounds=1, chunk_s=3, lag_s=3, browser_s=10, window_s=5,
             settle_s=1)


# --- The benchmark's own extension, in the measured server's process ----------------------


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": EXTENSION}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base, "bench", "threads"), ThreadsHandler),
        (url_path_join(base, "bench", "lag"), LagHandler, {"probe": LagProbe()}),
    ])


class LagProbe:
    """A task on the event loop that sleeps LAG_PERIOD_S at a time and keeps, for each
    wake-up, how late it came and how much CPU the loop's thread used meanwhile (work on the
    loop; the rest of a lag is time the thread waited for a CPU); and the garbage
    collector's pauses, which stop the loop too."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._wakeups: list[tuple[float, float]] = []
        self._collections: list[tuple[int, float]] = []
        self._collecting = 0.0

    def start(self) -> None:
        self._wakeups, self._collections = [], []
        gc.callbacks.append(self._collected)
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> dict[str, Any]:
        """Stop probing; the wake-ups as (lag, loop thread CPU) and the collections as
        (generation, pause), in seconds."""
        if self._task is not None:
            self._task.cancel()
            gc.callbacks.remove(self._collected)
        return {"wakeups": self._wakeups, "collections": self._collections}

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(LAG_PERIOD_S)
            self._wakeups.append((loop.time() - asked - LAG_PERIOD_S, time.thread_time() - cpu))

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collecting = time.perf_counter()
        else:
            self._collections.append((info["generation"],
                                      time.perf_counter() - self._collecting))


class ThreadsHandler(APIHandler):
    """GET bench/threads: the server's PID and the native id and name of its Python threads."""

    @web.authenticated
    def get(self) -> None:
        names = {thread.native_id: thread.name for thread in threading.enumerate()}
        self.finish(json.dumps({"pid": os.getpid(), "threads": names}))


class LagHandler(APIHandler):
    """POST bench/lag starts the loop-lag probe; DELETE stops it and answers what it saw."""

    def initialize(self, probe: LagProbe) -> None:
        self.probe = probe

    @web.authenticated
    def post(self) -> None:
        self.probe.start()
        self.finish("{}")

    @web.authenticated
    def delete(self) -> None:
        self.finish(json.dumps(self.probe.stop()))


# --- Figures --------------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def machine_busy_s() -> float:
    """CPU seconds the machine's CPUs have been busy so far (/proc/stat: user, nice, system,
    irq, softirq)."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = ticks
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


# --- The measured server --------------------------------------------------------------------


class Server:
    """The ``jupyter server`` measured, with this file's extension and two idle kernels."""

    def __init__(self, home: Path, arguments: tuple[str, ...] = ()) -> None:
        (home / "config").mkdir(parents=True)
        (home / "config/jupyter_server_config.json").write_text(json.dumps(
            {"ServerApp": {"jpserver_extensions": {EXTENSION: True}}}))
        root = home / "root"
        root.mkdir()
        self.process = JupyterProcess(
            home, root, "server", arguments,
            env={"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                os.environ.get("PYTHONPATH", "")])})
        self.headers = {"Authorization": f"token {self.process.token}"}

    def start(self) -> None:
        self.process.wait_ready()
        for number in (1, 2):
            self.process.api("api/sessions", "POST", {
                "path": f"bench-{number}.ipynb", "type": "notebook", "name": "",
                "kernel": {"name": "python3"}})
        deadline = time.monotonic() + 60
        while not all(kernel["rss"] for kernel in self.get("ipycloud/api/kernels")["kernels"]):
            assert time.monotonic() < deadline, "the kernels were not measured within 60 s"
            time.sleep(0.5)
        threads = self.get("bench/threads")
        self.pid = int(threads["pid"])
        self.sampler_tid = next(int(tid) for tid, name in threads["threads"].items()
                                if name == SAMPLER_THREAD)

    def get(self, path: str) -> Any:
        return self.process.api(path)

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.process.port, timeout=10)

    def thread_cpu_ns(self) -> dict[int, int]:
        """Each thread's run time so far, in ns (schedstat's first field)."""
        times = {}
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                times[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        return times

    def close(self) -> None:
        self.process.close()


class Client(threading.Thread):
    """Polls ``kind``'s routes about once a second, from a random point of the second after
    ``start`` until ``until`` (perf_counter times); keeps each answer's latency in ms by
    route."""

    def __init__(self, server: Server, kind: str, start: float, until: float,
                 rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.server, self.kind, self.rng = server, kind, rng
        self.next, self.until = start + rng.random(), until
        self.latencies: dict[str, list[float]] = {}
        self.failures: Counter[str] = Counter()
        self._last = time.time() - 1  # the newest reading seen, for history?since=

    def run(self) -> None:
        connection = self.server.connection()
        try:
            while self.next < self.until:
                time.sleep(max(0.0, self.next - time.perf_counter()))
                for route, path in self._routes():
                    self._ask(connection, route, path)
                # 1 s on average, drifting as a browser's polls do, so that no client keeps
                # in step with the server's own once-a-second work
                self.next += self.rng.uniform(0.95, 1.05)
        finally:
            connection.close()

    def _routes(self) -> list[tuple[str, str]]:
        if self.kind == "resource-usage":
            return [("api/metrics/v1", "/api/metrics/v1")]
        return [("history?since=", f"/ipycloud/api/history?since={self._last}"),
                ("reading", "/ipycloud/api/reading"), ("kernels", "/ipycloud/api/kernels")]

    def _ask(self, connection: http.client.HTTPConnection, route: str, path: str) -> None:
        started = time.perf_counter()
        connection.request("GET", path, headers=self.server.headers)
        response = connection.getresponse()
        body = response.read()
        elapsed_ms = (time.perf_counter() - started) * 1000
        if response.status != 200:
            self.failures[f"{route}: {response.status}"] += 1
            return
        self.latencies.setdefault(route, []).append(elapsed_ms)
        if route == "reading":
            self._last = json.loads(body)["time"]


def poll(server: Server, kind: str | None, clients: int, seconds: float, rng: random.Random,
         every: float | None = None) -> dict[str, Any]:
    """Run ``clients`` clients of ``kind`` for ``seconds``; with ``every``, the server's CPU
    by thread group in each chunk of that many seconds too."""
    start = time.perf_counter()
    pool = [Client(server, kind, start, start + seconds, random.Random(rng.random()))
            for _ in range(clients)] if kind else []
    for client in pool:
        client.start()
    chunks: list[dict[str, Any]] = []
    if every:
        before, began, began_unix = server.thread_cpu_ns(), start, time.time()
        for boundary in range(1, int(seconds / every + 1e-6) + 1):
            time.sleep(max(0.0, start + boundary * every - time.perf_counter()))
            after, ended, ended_unix = server.thread_cpu_ns(), time.perf_counter(), time.time()
            chunks.append({**cpu_split(server, before, after, ended - began),
                           "from": began_unix, "to": ended_unix})
            before, began, began_unix = after, ended, ended_unix
    else:
        time.sleep(max(0.0, start + seconds - time.perf_counter()))
    for client in pool:
        client.join()
    latencies: dict[str, list[float]] = {}
    failures: Counter[str] = Counter()
    for client in pool:
        failures.update(client.failures)
        for route, values in client.latencies.items():
            latencies.setdefault(route, []).extend(values)
    return {"latencies": latencies, "failures": dict(failures), "chunks": chunks}


def cpu_split(server: Server, before: dict[int, int], after: dict[int, int],
              wall: float) -> dict[str, Any]:
    """Percent of one core used by the whole process, the event loop's thread, the sampler
    thread and the rest, between two readings ``wall`` seconds apart; the sampler thread's
    CPU time in us."""
    used = {tid: after[tid] - before.get(tid, 0) for tid in after}
    total = sum(used.values())
    loop, sampler = used.get(server.pid, 0), used.get(server.sampler_tid, 0)

    def percent(ns: int) -> float:
        return ns / 1e9 / wall * 100

    return {"cpu_percent": {"process": percent(total), "event_loop_thread": percent(loop),
                            "sampler_thread": percent(sampler),
                            "other_threads": percent(total - loop - sampler)},
            "sampler_cpu_us": sampler / 1000}


def server_part(plan: Plan, home: Path, resource_usage: bool) -> dict[str, Any]:
    conditions: list[tuple[str, str | None, int]] = [
        ("idle", None, 0), ("ipycloud, 1 client", "ipycloud", 1),
        ("ipycloud, 20 clients", "ipycloud", CLIENTS)]
    if resource_usage:
        conditions += [("resource-usage, 1 client", "resource-usage", 1),
                       ("resource-usage, 20 clients", "resource-usage", CLIENTS)]
    rng = random.Random(0)
    server = Server(home / "server")
    try:
        server.start()
        for warm in dict.fromkeys(kind for _, kind, _ in conditions if kind):
            poll(server, warm, 2, plan.warm_s, rng)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in conditions}
        before = cpu_totals(server)
        for round_ in range(plan.rounds):
            order = conditions if round_ % 2 == 0 else conditions[::-1]
            for name, kind, clients in order:
                runs[name].append(poll(server, kind, clients, plan.phase_s, rng, plan.chunk_s))
        wall, busy, own, served = (after - first for after, first in
                                   zip(cpu_totals(server), before, strict=True))
        count_samples(runs, server.get("ipycloud/api/history")["samples"])
        lags = {name: loop_lag(server, kind, clients, plan.lag_s, rng)
                for name, kind, clients in conditions if clients in (0, CLIENTS)}
        threads = sorted(set(server.get("bench/threads")["threads"].values()))
    finally:
        server.close()
    if resource_usage:  # its setting to show CPU too, in a server of its own
        server = Server(home / "server-cpu", (RESOURCE_USAGE_CPU,))
        try:
            server.start()
            lags["idle, resource-usage with track_cpu_percent"] = loop_lag(
                server, None, 0, plan.lag_s, rng)
        finally:
            server.close()
    figures = {name: condition_figures(each) for name, each in runs.items()}
    per_sample = {n: figures[f"ipycloud, {n}"]["sampler_us_per_sample"]["pooled"]
                  for n in ("1 client", f"{CLIENTS} clients")}
    return {"conditions": figures,
            "sampler_ratio_20_to_1": per_sample[f"{CLIENTS} clients"] / per_sample["1 client"],
            # all CPUs' busy time less the server's and this process's: other work (the
            # server's two idle kernels included), in % of one core, over the CPU phases
            "other_processes_cpu_percent": (busy - own - served) / wall * 100,
            "loop_lag_ms": lags,
            "server_threads": threads}


def cpu_totals(server: Server) -> tuple[float, float, float, float]:
    """Seconds so far: wall time, the machine's busy CPU time, this process's CPU time and
    the server's."""
    return (time.perf_counter(), machine_busy_s(), time.process_time(),
            sum(server.thread_cpu_ns().values()) / 1e9)


def loop_lag(server: Server, kind: str | None, clients: int, seconds: float,
             rng: random.Random) -> dict[str, Any]:
    """The server's event loop lag while ``clients`` clients of ``kind`` poll."""
    server.process.api("bench/lag", "POST")
    poll(server, kind, clients, seconds, rng)
    return lag_figures(server.process.api("bench/lag", "DELETE"))


def count_samples(runs: dict[str, list[dict[str, Any]]], samples: list[dict[str, Any]]) -> None:
    """Count, in each chunk of ``runs``, the sampler's readings it took then (a figure per
    reading does not depend on whether a chunk holds 4 or 5 of them)."""
    times = [sample["time"] for sample in samples]
    for chunk in (chunk for each in runs.values() for run in each for chunk in run["chunks"]):
        chunk["samples"] = sum(chunk["from"] < when <= chunk["to"] for when in times)


def condition_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    chunks = [chunk for run in runs for chunk in run["chunks"]]
    latencies: dict[str, list[float]] = {}
    failures: Counter[str] = Counter()
    for run in runs:
        failures.update(run["failures"])
        for route, values in run["latencies"].items():
            latencies.setdefault(route, []).extend(values)
    return {
        "cpu_percent_of_one_core": {part: spread([chunk["cpu_percent"][part] for chunk in chunks])
                                    for part in chunks[0]["cpu_percent"]},
        "sampler_us_per_sample": {
            **spread([chunk["sampler_cpu_us"] / chunk["samples"] for chunk in chunks]),
            "pooled": (sum(chunk["sampler_cpu_us"] for chunk in chunks)
                       / sum(chunk["samples"] for chunk in chunks)),
            "samples": sum(chunk["samples"] for chunk in chunks)},
        "chunks": [{"cpu_percent": chunk["cpu_percent"], "samples": chunk["samples"],
                    "sampler_cpu_us": chunk["sampler_cpu_us"]} for chunk in chunks],
        "latency_ms": {route: {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99),
                               "max": max(values), "n": len(values)}
                       for route, values in latencies.items()},
        "failures": dict(failures),
    }


def lag_figures(probe: dict[str, Any]) -> dict[str, Any]:
    """The loop's lags in ms, with the loop thread's CPU during the late wake-ups and the
    garbage collector's pauses."""
    wakeups = [(lag * 1000, cpu * 1000) for lag, cpu in probe["wakeups"]]
    lags = [lag for lag, _ in wakeups]
    worst = max(wakeups)
    pauses = [pause * 1000 for _, pause in probe["collections"]]
    return {"max": worst[0], "loop_cpu_during_max": worst[1], "p99": percentile(lags, 0.99),
            "p50": percentile(lags, 0.5), "n": len(lags),
            # each wake-up late by the goal or more: (lag, the loop thread's CPU meanwhile)
            "late": [wakeup for wakeup in wakeups if wakeup[0] >= LAG_GOAL_MS],
            "gc_collections": dict(Counter(str(gen) for gen, _ in probe["collections"])),
            "gc_max_pause": max(pauses, default=0.0)}


# --- The browser ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PageCondition:
    name: str
    disabled: tuple[str, ...]  # lab extensions turned off
    ready: str  # what to wait for once the page is up: "ipycloud panel", "resource-usage", ""


def browser_part(plan: Plan, home: Path, resource_usage: bool) -> dict[str, Any]:
    from browser import lab_server, missing_requirements

    if missing := missing_requirements():
        return {"skipped": "the browser part needs " + "; ".join(missing)}
    others = (RESOURCE_USAGE_LAB,) if resource_usage else ()
    conditions = [PageCondition("without either extension", ("ipycloud", *others), ""),
                  PageCondition("ipycloud: status bar and open panel", others, "ipycloud panel")]
    if resource_usage:
        conditions.append(PageCondition("resource-usage: status bar", ("ipycloud",),
                                        "resource-usage"))
    root = home / "root"
    root.mkdir(parents=True)
    (root / "train.ipynb").write_text(json.dumps(
        {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with lab_server(home, root) as lab:
        lab.api("api/sessions", "POST", {"path": "train.ipynb", "type": "notebook", "name": "",
                                         "kernel": {"name": "python3"}})
        page_config = home / "config/labconfig/page_config.json"
        page_config.parent.mkdir(parents=True, exist_ok=True)
        figures = {}
        for condition in conditions:
            page_config.write_text(json.dumps(
                {"disabledExtensions": {name: True for name in condition.disabled}}))
            figures[condition.name] = page_cost(plan, lab, condition)
    return {"conditions": figures}


def page_cost(plan: Plan, lab: JupyterProcess, condition: PageCondition) -> dict[str, Any]:
    from browser import browser_page

    requests: Counter[str] = Counter()

    def count(request: Any) -> None:
        url = request.url.split("?")[0]
        if "/ipycloud/api/" in url:
            requests["ipycloud/api/" + url.rsplit("/ipycloud/api/", 1)[1]] += 1
        elif "/api/metrics/v1" in url:
            requests["api/metrics/v1"] += 1

    with browser_page() as page:
        page.on("request", count)
        page.goto(f"{lab.base}/lab?reset&token={lab.token}")
        page.locator("#jp-main-statusbar").wait_for(timeout=60_000)
        status = page.locator("#ipycloud-status")
        if condition.ready == "ipycloud panel":
            status.click(timeout=60_000)
            page.locator("#ipycloud-panel").get_by_text("train.ipynb").wait_for(timeout=60_000)
        elif condition.ready == "resource-usage":
            page.locator("#jp-main-statusbar").get_by_text("Mem:").wait_for(timeout=60_000)
        page.wait_for_timeout(plan.settle_s * 1000)
        assert (status.count() > 0) == (condition.ready == "ipycloud panel"), condition
        session = page.context.new_cdp_session(page)
        session.send("Performance.enable", {"timeDomain": "threadTicks"})
        readings = [page_metrics(session)]
        requests.clear()
        for _ in range(round(plan.browser_s / plan.window_s)):
            page.wait_for_timeout(plan.window_s * 1000)
            readings.append(page_metrics(session))
        visibility = page.evaluate("document.visibilityState")
    per_minute = 60 / plan.window_s
    windows = list(itertools.pairwise(readings))
    return {
        "script_ms_per_min": spread([(b["ScriptDuration"] - a["ScriptDuration"]) * 1000
                                     * per_minute for a, b in windows]),
        "task_ms_per_min": spread([(b["TaskDuration"] - a["TaskDuration"]) * 1000 * per_minute
                                   for a, b in windows]),
        "layout_and_style_ms_per_min": spread(
            [(b["LayoutDuration"] + b["RecalcStyleDuration"] - a["LayoutDuration"]
              - a["RecalcStyleDuration"]) * 1000 * per_minute for a, b in windows]),
        "js_heap_used_mb": readings[-1]["JSHeapUsedSize"] / 1e6,
        "dom_nodes": readings[-1]["Nodes"],
        "requests_per_min": {route: n * 60 / plan.browser_s for route, n in requests.items()},
        "visibility": visibility,
    }


def page_metrics(session: Any) -> dict[str, float]:
    return {metric["name"]: metric["value"]
            for metric in session.send("Performance.getMetrics")["metrics"]}


# --- Summary --------------------------------------------------------------------------------


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def summarize(results: dict[str, Any]) -> None:
    server = results["server"]
    conditions = server["conditions"]
    chunk_s = results["plan"]["chunk_s"]
    print(f"machine: {results['machine']['cpus']} CPUs, load average (before, between the "
          f"parts, after) {results['load_average']}; other processes used "
          f"{server['other_processes_cpu_percent']:.0f}% of one core during the server's CPU "
          f"phases" + (": shared with other work" if results["machine"]["shared"] else ""))
    if not results["resource_usage"]:
        print("jupyter-resource-usage is not installed: its figures are left out "
              "(pip install jupyter-resource-usage to compare)")
    for name, figures in conditions.items():
        cpu = figures["cpu_percent_of_one_core"]
        parts = ", ".join(f"{part} {value['median']:.2f}% ({value['min']:.2f}-"
                          f"{value['max']:.2f})" for part, value in cpu.items())
        sampler = figures["sampler_us_per_sample"]
        print(f"{name}: CPU, % of one core, median (min-max) of {chunk_s:g} s chunks: {parts}; "
              f"sampler thread per reading {sampler['pooled']:.0f} us over {sampler['samples']} "
              f"(chunks {sampler['min']:.0f}-{sampler['max']:.0f})")
        for route, latency in figures["latency_ms"].items():
            print(f"    {route}: p50 {latency['p50']:.2f} ms, p99 {latency['p99']:.2f} ms, "
                  f"max {latency['max']:.2f} ms over {latency['n']}")
        if figures["failures"]:
            print(f"    failed answers: {figures['failures']}")
    ratio = server["sampler_ratio_20_to_1"]
    print(f"goal 1, one sampler for all: sampler thread's CPU per reading with {CLIENTS} "
          f"clients / with 1 = "
          f"{ratio:.2f} (goal within {SAMPLER_GOAL_RATIO:g}x either way): "
          f"{verdict(1 / SAMPLER_GOAL_RATIO <= ratio <= SAMPLER_GOAL_RATIO)}")
    for name, lag in server["loop_lag_ms"].items():
        goal = (f" (goal < {LAG_GOAL_MS:g} ms): {verdict(lag['max'] < LAG_GOAL_MS)}"
                if name == f"ipycloud, {CLIENTS} clients" else "")
        print(f"event loop lag, {name}: worst {lag['max']:.2f} ms (the loop's thread ran "
              f"{lag['loop_cpu_during_max']:.2f} ms meanwhile), p99 {lag['p99']:.2f} ms, "
              f"{len(lag['late'])} of {lag['n']} wake-ups late by {LAG_GOAL_MS:g} ms or more; "
              f"garbage collections {lag['gc_collections']}, longest "
              f"{lag['gc_max_pause']:.2f} ms{goal}")
    browser = results["browser"]
    if "skipped" in browser:
        print(f"browser: skipped: {browser['skipped']}")
        return
    for name, page in browser["conditions"].items():
        print(f"browser, {name}: script {page['script_ms_per_min']['median']:.0f} ms/min "
              f"({page['script_ms_per_min']['min']:.0f}-{page['script_ms_per_min']['max']:.0f}), "
              f"tasks {page['task_ms_per_min']['median']:.0f} ms/min "
              f"({page['task_ms_per_min']['min']:.0f}-{page['task_ms_per_min']['max']:.0f}), "
              f"heap {page['js_heap_used_mb']:.1f} MB, {page['dom_nodes']:.0f} DOM nodes, "
              f"requests/min {page['requests_per_min']}")
    print(f"written to {RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 1.5 minutes")
    plan = QUICK if parser.parse_args().quick else FULL
    resource_usage = importlib.util.find_spec("jupyter_resource_usage") is not None
    if not resource_usage:
        print("jupyter-resource-usage is not installed: measuring ipycloud alone")
    load_before = load_average()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-server-") as folder:
        server = server_part(plan, Path(folder), resource_usage)
        server_s, load_between = time.perf_counter() - started, load_average()
        browser = browser_part(plan, Path(folder) / "lab", resource_usage)
    loads = [load_before, load_between, load_average()]
    results = {
        "machine": {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "shared": server["other_processes_cpu_percent"] > SHARED_PERCENT},
        "load_average": loads,
        "resource_usage": resource_usage,
        "plan": {**asdict(plan), "clients": CLIENTS, "lag_period_s": LAG_PERIOD_S},
        "seconds": {"server": server_s, "browser": time.perf_counter() - started - server_s},
        "server": server,
        "browser": browser,
    }
    write_results(RESULTS, results)
    summarize(results)


if __name__ == "__main__":
    main()
