"""Benchmark: how long an alert takes from its event to the receiver, and what alerting
costs the thread that alerts.

Goal: at most 5 s from the event to the receiver. A loopback HTTP receiver stands for the
service (Apprise's ``json://127.0.0.1:PORT/...``); it notes ``time.perf_counter()`` when
each request arrives. Measured: the first alert of the process (Apprise is imported then),
``ALERTS`` more through the process's notifier (its rate limit cleared before each), the
``finished`` alert of a real ``fit`` (from the moment fit tells its callbacks that the run
ended) and, as the reference, the same message sent by Apprise directly on the calling
thread. Run: ``python benchmarks/notify_latency.py``;
results go to ``benchmarks/results/notify_latency.json``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from figures import distribution, machine, write_results

RESULTS = Path(__file__).parent / "results" / "notify_latency.json"
ALERTS = 50
GOAL_S = 5.0


class _Receiver(BaseHTTPRequestHandler):
    arrivals: ClassVar[list[float]] = []
    arrived = threading.Condition()

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.arrived:
            self.arrivals.append(time.perf_counter())
            self.arrived.notify_all()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def arrival(count: int) -> float:
    """When the ``count``-th request arrived (waiting for it)."""
    with _Receiver.arrived:
        assert _Receiver.arrived.wait_for(lambda: len(_Receiver.arrivals) >= count, 30)
        return _Receiver.arrivals[count - 1]


def through_notifier() -> tuple[float, list[float], list[float]]:
    """The first alert's latency, then each later one's, and what each ``notify`` call
    cost its caller (reading the configuration, queueing)."""
    from ipycloud.runtime import notify

    began = time.perf_counter()
    notify.notify("deadline", "first", "the process's first alert")
    first = arrival(1) - began
    latencies, costs = [], []
    for index in range(ALERTS):
        notify.sender.notifier()._last.clear()  # no rate limit: each alert goes
        began = time.perf_counter()
        notify.notify("finished", f"alert {index}", "body")
        costs.append(time.perf_counter() - began)
        latencies.append(arrival(index + 2) - began)
    return first, latencies, costs


def from_fit(count: int) -> float:
    """From fit's end of a run to the arrival of its ``finished`` alert."""
    import torch

    import ipycloud
    from ipycloud.runtime.train import callback

    ended: list[float] = []

    class Clock(callback.Callback):
        def on_end(self, end: Any) -> None:
            ended.append(time.perf_counter())

    def clock(start: Any) -> Any:  # a callback told only the end
        return Clock()

    callback.register_front(clock)
    ipycloud.runtime.notify.sender.notifier()._last.clear()  # no rate limit
    model = torch.nn.Linear(4, 2)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
    ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, device="cpu",
                 progress=False)
    return arrival(count) - ended[0]


def direct(url: str, count: int) -> list[float]:
    """Apprise sending on this thread, without ipycloud: the reference."""
    import apprise

    service = apprise.Apprise.instantiate(url)
    assert service is not None
    latencies = []
    for index in range(ALERTS):
        began = time.perf_counter()
        service.notify(body="body", title=f"direct {index}")
        latencies.append(arrival(count + index + 1) - began)
    return latencies


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"json://127.0.0.1:{server.server_address[1]}/bench"
    os.environ["IPYCLOUD_CONFIG_DIR"] = tempfile.mkdtemp(prefix="ipycloud-bench-config-")
    os.environ["IPYCLOUD_NOTIFY"] = url

    first, latencies, costs = through_notifier()
    fit_latency = from_fit(ALERTS + 2)
    reference = direct(url, ALERTS + 2)
    server.shutdown()

    later, alone, cost = (distribution(latencies), distribution(reference),
                          distribution([seconds * 1e6 for seconds in costs]))
    results = {
        "goal_s": GOAL_S,
        "first_alert_s": round(first, 3),
        "alert_s": later,
        "fit_finished_alert_s": round(fit_latency, 3),
        "apprise_direct_s": alone,
        "caller_cost_us": cost,
        "alerts": ALERTS,
        "machine": machine(),
    }
    worst = max(first, fit_latency, later["max"])
    print(f"first alert (Apprise imported): {first:.3f} s; later ones: median "
          f"{later['median']:.3f} s, max {later['max']:.3f} s (Apprise alone: median "
          f"{alone['median']:.3f} s)")
    print(f"fit's finished alert: {fit_latency:.3f} s after the run ended")
    print(f"cost to the caller: median {cost['median']} us, max {cost['max']} us")
    print(f"worst {worst:.3f} s against the goal of {GOAL_S} s: "
          f"{'met' if worst <= GOAL_S else 'MISSED'}")
    write_results(RESULTS, results)
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
