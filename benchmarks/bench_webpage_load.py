"""Benchmark: the dashboard page a kernel serves itself (``%dashboard --web``) under 50 pages
polling it at once.

Goal: 50 clients polling ``api/reading`` for 30 s get every answer (0 failed requests) with
a p99 latency under 50 ms.

A real Jupyter kernel, with ipycloud loaded as a user has it, runs ``%dashboard --web
--interval 0.1`` (the fastest pace a page may ask for: its sampler reads every 0.1 s), then
sleeps in a cell while this process, a separate one, plays the pages: 50 client threads
start at the same instant and each asks ``api/reading`` with the token, then waits the
page's interval after each answer, as the page does. Two rounds of 30 s each:

- ``kept_connection``: each client keeps one connection, as a browser's page does;
- ``new_connection``: each request opens a connection of its own, as ``curl`` does.

A request fails when it is refused, reset, not answered within the page's 10 s, or answered
other than 200. Latency runs from before connecting (or sending, on a kept connection) to
the whole body read. The kernel's CPU time (every thread, read in the sleeping cell) over
each round is recorded as percent of one core. The clients run in this process on the same
machine: their own work is in the latencies, which are an upper bound of the server's.

Run: ``python benchmarks/bench_webpage_load.py`` (about 90 s); results go to
``benchmarks/results/webpage_load.json``.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).parent))
from bench_dashboard import Kernel
from figures import percentile, write_results

RESULTS = Path(__file__).parent / "results" / "webpage_load.json"
CLIENTS = 50
ROUND_S = 30.0
POLL_S = 0.1  # the page's interval: the sampler's, the fastest a page may ask for
TIMEOUT_S = 10.0  # the page's own limit on one request (labextension/src/page/client.ts)
OPEN = f"view = %dashboard --web --interval {POLL_S}\nprint(view.url)"
# The CPU time of the whole kernel process (every thread) while its main thread sleeps.
SLEEPING_CELL = ("import time\n_started = time.process_time()\ntime.sleep({seconds})\n"
                 "print(time.process_time() - _started)")


class PollingClient(threading.Thread):
    """One page: asks ``api/reading`` until ``until`` (a monotonic time), waiting POLL_S
    after each answer; on one kept connection, or a new one for each request."""

    def __init__(self, address: tuple[str, int], token: str, keep: bool,
                 start: threading.Barrier, until: float) -> None:
        super().__init__(name="page-client", daemon=True)
        self.address, self.path, self.keep = address, f"/api/reading?token={token}", keep
        self.start_together, self.until = start, until
        self.latencies_ms: list[float] = []
        self.failures: Counter[str] = Counter()
        self._connection: http.client.HTTPConnection | None = None

    def run(self) -> None:
        self.start_together.wait()
        while time.monotonic() < self.until:
            self._ask()
            time.sleep(POLL_S)
        self._disconnect()

    def _ask(self) -> None:
        started = time.perf_counter()
        try:
            if self._connection is None:
                self._connection = http.client.HTTPConnection(*self.address, timeout=TIMEOUT_S)
            self._connection.request("GET", self.path)
            response = self._connection.getresponse()
            json.loads(response.read())
            if response.status != 200:
                self.failures[f"status {response.status}"] += 1
            if not self.keep or response.will_close:
                self._disconnect()
        except (OSError, http.client.HTTPException, ValueError) as error:
            self.failures[type(error).__name__] += 1
            self._disconnect()
        self.latencies_ms.append((time.perf_counter() - started) * 1000)

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def load_round(kernel: Kernel, url: str, keep: bool) -> dict[str, Any]:
    """CLIENTS pages polling for ROUND_S while the kernel sleeps in a cell."""
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    token = parse_qs(parts.query)["token"][0]
    cpu: list[float] = []
    sleeping = threading.Thread(target=lambda: cpu.append(float(kernel.run(
        SLEEPING_CELL.format(seconds=ROUND_S + 2)))))
    sleeping.start()
    time.sleep(1)  # the cell is running
    start = threading.Barrier(CLIENTS + 1)
    until = time.monotonic() + ROUND_S
    clients = [PollingClient(address, token, keep, start, until) for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    start.wait()
    began = time.monotonic()
    for client in clients:
        client.join()
    wall = time.monotonic() - began
    sleeping.join()
    latencies = [value for client in clients for value in client.latencies_ms]
    failures = sum((client.failures for client in clients), Counter())
    return {
        "requests": len(latencies),
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "latency_ms": {"p50": percentile(latencies, 0.50), "p99": percentile(latencies, 0.99),
                       "max": max(latencies)},
        "requests_per_s": len(latencies) / wall,
        "kernel_core_percent": 100 * cpu[0] / (ROUND_S + 2),
    }


def main() -> None:
    load_before = os.getloadavg()[0]
    kernel = Kernel()
    try:
        kernel.run("%load_ext ipycloud")
        url = kernel.run(OPEN).strip()
        time.sleep(1)  # the sampler's first readings
        rounds = {"kept_connection": load_round(kernel, url, keep=True),
                  "new_connection": load_round(kernel, url, keep=False)}
        kernel.run("%dashboard stop")
    finally:
        kernel.close()
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "clients": CLIENTS, "round_s": ROUND_S, "poll_s": POLL_S,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rounds": rounds,
        "goals": {"failed": 0, "p99_ms": 50.0},
    }
    write_results(RESULTS, results)
    for name, figures in rounds.items():
        latency = figures["latency_ms"]
        print(f"{name}: {CLIENTS} clients for {ROUND_S:.0f} s, {figures['requests']} requests, "
              f"{figures['failed']} failed (goal 0), latency p50 {latency['p50']:.1f} ms, "
              f"p99 {latency['p99']:.1f} ms (goal < 50), max {latency['max']:.1f} ms, "
              f"{figures['requests_per_s']:.0f} requests/s; the kernel used "
              f"{figures['kernel_core_percent']:.1f}% of one core")
    print(f"load average before and after: {results['load_average']}; written to {RESULTS}")


if __name__ == "__main__":
    main()
