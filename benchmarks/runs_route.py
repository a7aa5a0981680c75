"""Benchmark: the server extension's runs routes under 20 lab pages polling them.

Goal: 20 clients polling ``GET ipycloud/api/runs`` once a second for 30 s get every answer
(0 failed requests) with a p99 latency under 50 ms.

A real ``jupyter server`` subprocess (tests/jupyter_process.py) with ipycloud's extension
serves a root folder shaped like a user's: FOLDERS project folders of notebooks and data
files, FINISHED finished runs of RUN_STEPS logged steps each in checkpoint folders among
them, and one live run whose log a thread of this process grows by a step row every
LIVE_STEP_S seconds, as ``fit`` writes it. The server's state folder (index, history) is a
fresh one. Each client is a thread with its own keep-alive connection that, about once a
second (each period drawn from 0.95-1.05 s, as browsers' polls drift), asks ``runs`` and
then ``runs/<live id>?since=<the last record's time it saw>``, as a lab page following a
run does, and Jupyter's own ``api/status`` as the reference of a route that reads no file.
A request fails when it is refused, reset, not answered within 10 s, or answered other
than 200. Latency runs from sending to the whole body read, measured in this process: the
clients' own work is in it, so it is an upper bound of the server's. The server's CPU time
over the round (``/proc/<pid>/stat``) is given in percent of one core.

Run: ``python benchmarks/runs_route.py [--quick]`` (about 45 s, or 15); results go to
``benchmarks/results/runs_route.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from figures import machine, percentile, write_results

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from jupyter_process import JupyterProcess  # noqa: E402
from waiting import wait_for  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "runs_route.json"
CLIENTS = 20
ROUND_S = 30.0
QUICK_ROUND_S = 8.0
TIMEOUT_S = 10.0
GOAL_P99_MS = 50.0
FOLDERS = 200  # project folders under the root, each with a few files
FINISHED = 5
RUN_STEPS = 2000
LIVE_STEP_S = 0.2
LIVE_ID = "0123456789ab"
ROUTES = ("runs", "run", "status")


def run_lines(run_id: str, folder: Path, started: float, steps: int) -> list[dict[str, Any]]:
    """The records ``fit`` writes for a run: a start, then ``steps`` step rows."""
    start = {"t": started, "kind": "start", "run": run_id, "pid": os.getpid(),
             "host": socket.gethostname(), "kernel": None, "notebook": "train.ipynb",
             "platform": "Local machine", "session_left_s": None, "device": "cpu",
             "precision": "fp32", "model": "Net", "parameters": 1000, "optimizer": "AdamW",
             "batch_size": 32, "grad_accum": 1, "world_size": 1, "step": 0, "epoch": 0,
             "total_steps": 100_000, "epochs": 10, "max_steps": None, "folder": str(folder)}
    return [start, *(step_line(started + step, step) for step in range(1, steps + 1))]


def step_line(at: float, step: int) -> dict[str, Any]:
    return {"t": at, "kind": "step", "step": step, "epoch": step // 10_000,
            "loss": 1.0 / step, "lr": 1e-3, "steps_per_s": 5.0, "samples_per_s": 160.0}


def write_log(folder: Path, run_id: str, lines: list[dict[str, Any]]) -> Path:
    log = folder / ".ipycloud-runs" / f"{run_id}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return log


def make_root(root: Path) -> Path:
    """The root folder; returns the live run's log."""
    now = time.time()
    for index in range(FOLDERS):
        project = root / f"project {index}"
        (project / "data").mkdir(parents=True)
        (project / "train.ipynb").write_text("{}")
        (project / "data" / "x.csv").write_text("1,2\n")
    for index in range(FINISHED):
        folder = root / f"project {index * 7}" / "checkpoints"
        lines = run_lines(f"{index:012x}", folder, now - 86400 + index * 3600, RUN_STEPS)
        lines.append({"t": lines[-1]["t"] + 1, "kind": "end", "status": "finished",
                      "reason": None, "step": RUN_STEPS, "epoch": 1, "best": None})
        write_log(folder, f"{index:012x}", lines)
    live = root / "project 1" / "checkpoints"
    return write_log(live, LIVE_ID, run_lines(LIVE_ID, live, now - RUN_STEPS, RUN_STEPS))


class LiveRun(threading.Thread):
    """Appends a step row to the live run's log every LIVE_STEP_S seconds until stopped."""

    def __init__(self, log: Path) -> None:
        super().__init__(name="live-run", daemon=True)
        self.log, self.stop = log, threading.Event()

    def run(self) -> None:
        step = RUN_STEPS
        descriptor = os.open(self.log, os.O_WRONLY | os.O_APPEND)
        try:
            while not self.stop.wait(LIVE_STEP_S):
                step += 1
                os.write(descriptor, (json.dumps(step_line(time.time(), step)) + "\n").encode())
        finally:
            os.close(descriptor)


class PollingClient(threading.Thread):
    """One lab page: every 0.95-1.05 s asks ``runs``, the live run since its last record,
    and ``api/status``, on one kept connection, until ``until`` (a monotonic time)."""

    decode = staticmethod(json.loads)  # an answer's body; ValueError: it failed

    def __init__(self, server: JupyterProcess, until: float, seed: int) -> None:
        super().__init__(name="runs-client", daemon=True)
        self.server, self.until = server, until
        self.random = random.Random(seed)
        self.latencies_ms: dict[str, list[float]] = defaultdict(list)
        self.failures: Counter[str] = Counter()
        self.since = 0.0
        self._connection: http.client.HTTPConnection | None = None

    def run(self) -> None:
        time.sleep(self.random.uniform(0, 1))  # pages opened at different moments
        while time.monotonic() < self.until:
            began = time.monotonic()
            self._ask("runs", "ipycloud/api/runs")
            answer = self._ask("run", f"ipycloud/api/runs/{LIVE_ID}?since={self.since!r}")
            if answer is not None and answer["records"]:
                self.since = answer["records"][-1]["t"]
            self._ask("status", "api/status")
            time.sleep(max(0.0, self.random.uniform(0.95, 1.05) - (time.monotonic() - began)))
        if self._connection is not None:
            self._connection.close()

    def _ask(self, route: str, path: str) -> Any:
        started = time.perf_counter()
        answer = None
        try:
            if self._connection is None:
                self._connection = http.client.HTTPConnection("127.0.0.1", self.server.port,
                                                              timeout=TIMEOUT_S)
            self._connection.request("GET", f"/{path}", headers={
                "Authorization": f"token {self.server.token}"})
            response = self._connection.getresponse()
            answer = self.decode(response.read())
            if response.status != 200:
                self.failures[f"{route}: status {response.status}"] += 1
                answer = None
        except (OSError, http.client.HTTPException, ValueError) as error:
            self.failures[f"{route}: {type(error).__name__}"] += 1
            if self._connection is not None:
                self._connection.close()
                self._connection = None
        self.latencies_ms[route].append((time.perf_counter() - started) * 1000)
        return answer


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_round(server: JupyterProcess, round_s: float, client: type[PollingClient] = PollingClient,
               routes: tuple[str, ...] = ROUTES) -> dict[str, Any]:
    """CLIENTS pages (``client``, asking ``routes``) polling for ``round_s`` seconds."""
    until = time.monotonic() + round_s
    clients = [client(server, until, seed) for seed in range(CLIENTS)]
    cpu_before, began = cpu_seconds(server.process.pid), time.monotonic()
    for polling in clients:
        polling.start()
    for polling in clients:
        polling.join()
    wall = time.monotonic() - began
    server_cpu = cpu_seconds(server.process.pid) - cpu_before
    failures = sum((polling.failures for polling in clients), Counter())
    latencies = {route: [value for polling in clients for value in polling.latencies_ms[route]]
                 for route in routes}
    return {
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "routes": {route: {"requests": len(values),
                           "p50_ms": round(percentile(values, 0.50), 2),
                           "p99_ms": round(percentile(values, 0.99), 2),
                           "max_ms": round(max(values), 2)}
                   for route, values in latencies.items()},
        "server_core_percent": round(100 * server_cpu / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short round, for a check")
    round_s = QUICK_ROUND_S if parser.parse_args().quick else ROUND_S
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="runs-route-") as temporary:
        folder = Path(temporary)
        root, home = folder / "root", folder / "home"
        root.mkdir()
        home.mkdir()
        live = LiveRun(make_root(root))
        server = JupyterProcess(home, root, env={"IPYCLOUD_STATE_DIR": str(folder / "state")})
        try:
            server.wait_ready()
            wait_for(lambda: len(server.api("ipycloud/api/runs")["runs"]) == FINISHED + 1, 30,
                     "the runs to be listed")
            live.start()
            figures = load_round(server, round_s)
        finally:
            live.stop.set()
            server.close()
    results = {
        "machine": {**machine(), "load_average_1min_at_start": round(load_before, 2)},
        "clients": CLIENTS, "round_s": round_s, "root_folders": FOLDERS * 2 + 1,
        "runs": {"finished": FINISHED, "steps_each": RUN_STEPS, "live": 1,
                 "live_step_s": LIVE_STEP_S},
        **figures,
        "goals": {"failed": 0, "runs_p99_ms": GOAL_P99_MS},
    }
    write_results(RESULTS, results)
    for route, row in figures["routes"].items():
        print(f"{route}: {row['requests']} requests, latency p50 {row['p50_ms']:.1f} ms, "
              f"p99 {row['p99_ms']:.1f} ms, max {row['max_ms']:.1f} ms")
    print(f"{CLIENTS} clients for {round_s:.0f} s: {figures['failed']} failed (goal 0); runs "
          f"p99 {figures['routes']['runs']['p99_ms']:.1f} ms (goal < {GOAL_P99_MS:.0f}); "
          f"the server used {figures['server_core_percent']}% of one core; written to "
          f"{RESULTS}")


if __name__ == "__main__":
    main()
