"""Benchmark: training throughput with a live ``%dashboard`` against without, and its cost per tick.

Goal: a CPU training loop (an MLP, one thread, fp32, AdamW) keeps at least 0.99x its steps/s
while a dashboard updates at 1 Hz. The loop runs in a real Jupyter kernel: the dashboard's
sampler thread shares the kernel's interpreter with the loop, and every trait change goes
out as a comm message on the kernel's iopub socket to this client, which reads them all as
a frontend would (without drawing). Rounds alternate with and without the dashboard (no
sampler thread at all), in A B B A order, so drift hits both alike. The figures are medians;
since other work on a small machine slows single runs at random, the median of each
round's ratio and the best run of each kind are given too, with the CPU time the kernel's
other threads used during the runs (the dashboard's own cost, which such noise barely touches).
Also measured, in this process: the time one sample and one dashboard update take.
Run: ``python benchmarks/bench_dashboard.py``; results go to
``benchmarks/results/dashboard.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from figures import write_results
from jupyter_client.manager import start_new_kernel

RESULTS = Path(__file__).parent / "results" / "dashboard.json"
ROUNDS = 40
STEPS = 1500
BATCH = 64
TICKS = 200

SETUP = f"""
import json, time, torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
inputs, labels = torch.randn({BATCH}, 64), torch.randint(0, 10, ({BATCH},))

def train(steps):
    started, cpu, own_cpu = time.perf_counter(), time.process_time(), time.thread_time()
    for step in range(steps):
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            loss.item()
    wall = time.perf_counter() - started
    others = (time.process_time() - cpu) - (time.thread_time() - own_cpu)
    return json.dumps({{"steps_per_s": steps / wall, "other_threads_cpu_share": others / wall}})

%load_ext ipycloud
"""


class Kernel:
    """A real IPython kernel and a client that reads all it sends, comm messages included."""

    def __init__(self) -> None:
        self.manager, self.client = start_new_kernel(kernel_name="python3")
        self.comm_messages = 0

    def run(self, code: str) -> str:
        """Execute ``code``; returns its stdout, raises on an error."""
        stdout: list[str] = []

        def read(message: dict[str, Any]) -> None:
            kind, content = message["msg_type"], message["content"]
            if kind == "stream" and content["name"] == "stdout":
                stdout.append(content["text"])
            elif kind == "comm_msg":
                self.comm_messages += 1
            elif kind == "error":
                raise RuntimeError("\n".join(content["traceback"]))

        reply = self.client.execute_interactive(code, output_hook=read, timeout=300)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{code!r} failed: {reply['content']}")
        return "".join(stdout)

    def train(self) -> dict[str, float]:
        """Steps/s of one run, and the CPU the kernel's other threads used per second of it."""
        return dict(json.loads(self.run(f"print(train({STEPS}))")))

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)


def throughput() -> dict[str, Any]:
    kernel = Kernel()
    try:
        kernel.run(SETUP)
        kernel.train()  # warm up allocators and kernels once
        runs: dict[str, list[dict[str, float]]] = {"without": [], "with_dashboard": []}
        comm_messages: list[int] = []
        for round_ in range(ROUNDS):
            if round_ % 2:  # every other round runs the dashboard first: A B B A ...
                comm_messages.append(with_dashboard(kernel, runs["with_dashboard"]))
            runs["without"].append(kernel.train())
            if not round_ % 2:
                comm_messages.append(with_dashboard(kernel, runs["with_dashboard"]))
    finally:
        kernel.close()
    rates = {name: [run["steps_per_s"] for run in each] for name, each in runs.items()}
    others = {name: statistics.median(run["other_threads_cpu_share"] for run in each)
              for name, each in runs.items()}
    medians = {name: statistics.median(values) for name, values in rates.items()}
    paired = [with_ / without for with_, without in zip(rates["with_dashboard"],
                                                         rates["without"], strict=True)]
    return {"steps_per_s": medians, "ratio": medians["with_dashboard"] / medians["without"],
            "paired_ratio_median": statistics.median(paired),
            "best_ratio": max(rates["with_dashboard"]) / max(rates["without"]),
            # CPU the kernel's other threads (sampler, iopub, heartbeat) used, in cores
            "other_threads_cpu_share": others,
            "dashboard_cpu_share": others["with_dashboard"] - others["without"],
            "samples": rates, "comm_messages_per_run": comm_messages}


def with_dashboard(kernel: Kernel, runs: list[dict[str, float]]) -> int:
    """One run with a live dashboard at 1 Hz; returns the comm messages read meanwhile."""
    kernel.run("d = %dashboard --interval 1\nd")
    before = kernel.comm_messages
    runs.append(kernel.train())
    sent = kernel.comm_messages - before
    kernel.run("%dashboard stop")
    return sent


def tick_cost() -> dict[str, float]:
    """Milliseconds one take_sample() and one Dashboard.update() take here (medians)."""
    from ipycloud.runtime.monitor.probe import take_sample
    from ipycloud.runtime.monitor.sampler import Sampler
    from ipycloud.widgets.dashboard import Dashboard

    dashboard = Dashboard(Sampler(), interval=1.0)  # not started: updates are driven here
    sample_ms, update_ms = [], []
    for tick in range(TICKS):
        started = time.perf_counter()
        sample = take_sample()
        sampled = time.perf_counter()
        dashboard.update(dataclasses.replace(sample, time=sample.time + tick))
        sample_ms.append((sampled - started) * 1000)
        update_ms.append((time.perf_counter() - sampled) * 1000)
    return {"take_sample_ms": statistics.median(sample_ms),
            "dashboard_update_ms": statistics.median(update_ms)}


def main() -> None:
    import torch

    load_before = os.getloadavg()[0]
    ticks = tick_cost()
    runs = throughput()
    results = {
        "machine": {"torch": torch.__version__, "threads": 1, "steps_per_run": STEPS,
                    "batch": BATCH, "rounds": ROUNDS, "dashboard_interval_s": 1.0,
                    "cpus": os.cpu_count()},
        # other work on the machine slows runs at random: the 1-minute load average tells
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        **runs,
        "goal_ratio": 0.99,
        "per_tick": ticks,
    }
    write_results(RESULTS, results)
    medians = runs["steps_per_s"]
    print(f"steps/s in a kernel (median of {ROUNDS}): without {medians['without']:.0f}, with "
          f"a live dashboard at 1 Hz {medians['with_dashboard']:.0f}")
    print(f"with / without = {runs['ratio']:.3f} (goal >= 0.99); median of the rounds' ratios "
          f"{runs['paired_ratio_median']:.3f}; best run against best run "
          f"{runs['best_ratio']:.3f}")
    print(f"CPU of the dashboard (sampler thread and its comm messages): "
          f"{runs['dashboard_cpu_share'] * 100:.3f}% of one core")
    print(f"comm messages per run of {STEPS} steps: "
          f"{statistics.median(runs['comm_messages_per_run']):.0f}; load average before and "
          f"after: {results['load_average']}")
    print(f"per tick: take_sample {ticks['take_sample_ms']:.2f} ms, dashboard update "
          f"{ticks['dashboard_update_ms']:.2f} ms")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
