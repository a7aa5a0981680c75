"""Benchmark: what the live curves cost ``fit`` in a notebook.

Goal: ``ipycloud.fit(progress=True)`` (the bar and the live curves, redrawn once a second)
runs at least 0.99x the steps/s of ``progress="bar"`` (the same bar, no curves) on the
benchmark MLP of ``bench_fit.py`` (64-256-256-10, batches of 64, AdamW, fp32, one CPU
thread), both in a real Jupyter kernel, where the curves are drawn and sent to the front.
Each round runs the two one after the other, the order swapped from round to round; the
goal is judged on the median of each round's paired ratio, so drift between rounds
cancels out. One untimed round warms up first. Every sample is kept in the JSON. Steps/s
are given of wall-clock time and of the kernel process's CPU time (its threads that send
the output included): on a shared machine the CPU-time ratio is the steadier one, as it
counts no time spent waiting for a core that another process holds, and it is the one the
goal is judged on.

Beside it, in this process: the cost of one redraw (the HTML of the charts with every line
at its full ``MAX_POINTS``) and of following one logged row, and the share of a second
they take at the measured pace (one redraw a second, one row every ``log_every`` steps).

Run: ``python benchmarks/live_curves.py [--quick]`` (about 2 minutes; ``--quick``: 3
rounds); results go to ``benchmarks/results/live_curves.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from figures import machine, write_results
from jupyter_client.manager import KernelManager

from ipycloud.notebook.curves import LiveCurves
from ipycloud.runtime.train.callback import RunStart
from ipycloud.runtime.train.curves import MAX_POINTS, TrainingCurves

RESULTS = Path(__file__).parent / "results" / "live_curves.json"
ROOT = Path(__file__).parent.parent
GOAL = 0.99
STEPS = 3000
ROUNDS, QUICK_ROUNDS = 9, 3
LOG_EVERY = 10  # fit's default: one row to the callbacks every 10 steps

SETUP = f"""
import json, sys, time, torch, ipycloud
sys.path.insert(0, {str(Path(__file__).parent)!r})
from bench_fit import CASES
torch.set_num_threads(1)
MLP = next(case for case in CASES if case.name == "mlp")
"""
RUN = """
model, optimizer, loader = MLP.parts({steps})
started, cpu = time.perf_counter(), time.process_time()
ipycloud.fit(model, optimizer, loader, epochs=1, precision="fp32", device="cpu",
             progress={progress!r})
print("RATE", json.dumps([{steps} / (time.perf_counter() - started),
                          {steps} / (time.process_time() - cpu)]))
"""
VARIANTS = {"curves": True, "bar_only": "bar"}


class Kernel:
    """A real ipykernel that imports this checkout, its output read and dropped."""

    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="python3")
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.manager.start_kernel(cwd=str(ROOT), env={**os.environ, "PYTHONPATH": path})
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.messages: dict[str, int] = {}

    def run(self, code: str) -> str:
        """Execute ``code``; its printed text. Counts the output messages by type."""
        texts: list[str] = []

        def collect(message: dict[str, Any]) -> None:
            kind = message["msg_type"]
            self.messages[kind] = self.messages.get(kind, 0) + 1
            if kind == "stream" and message["content"]["name"] == "stdout":
                texts.append(message["content"]["text"])
            elif kind == "error":
                texts.append("\n".join(message["content"]["traceback"]))

        reply = self.client.execute_interactive(code, timeout=600, output_hook=collect)
        if reply["content"]["status"] != "ok":
            raise RuntimeError("".join(texts))
        return "".join(texts)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def rates(kernel: Kernel, progress: Any, steps: int) -> tuple[float, float]:
    """Steps/s of wall-clock time and of the kernel's CPU time, of one run of fit."""
    text = kernel.run(RUN.format(steps=steps, progress=progress))
    wall, cpu = json.loads(next(line for line in text.splitlines()
                                if line.startswith("RATE")).split(maxsplit=1)[1])
    return wall, cpu


def in_the_kernel(rounds: int, steps: int) -> dict[str, Any]:
    kernel = Kernel()
    try:
        kernel.run(SETUP)
        for progress in VARIANTS.values():
            rates(kernel, progress, steps)
        kernel.messages.clear()
        samples: dict[str, dict[str, list[float]]] = {"wall": {}, "cpu": {}}
        for round_ in range(rounds):
            order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                wall, cpu = rates(kernel, VARIANTS[name], steps)
                samples["wall"].setdefault(name, []).append(wall)
                samples["cpu"].setdefault(name, []).append(cpu)
        messages = dict(kernel.messages)
    finally:
        kernel.close()
    figures: dict[str, Any] = {"steps_per_run": steps, "rounds": rounds,
                               "redraws_per_run_with_curves":
                                   messages.get("update_display_data", 0) / rounds + 1}
    for clock, runs in samples.items():
        paired = [with_curves / bar for with_curves, bar
                  in zip(runs["curves"], runs["bar_only"], strict=True)]
        figures[clock] = {
            "steps_per_s": {name: statistics.median(values) for name, values in runs.items()},
            "spread_min_max": {name: [min(values), max(values)] for name, values in runs.items()},
            "curves_vs_bar_only_paired": statistics.median(paired),
            "paired_spread": [min(paired), max(paired)], "samples": runs}
    return figures


def _median_s(action: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


class _Nowhere:
    def show(self, html: str) -> None:
        pass


def in_this_process(steps_per_s: float) -> dict[str, Any]:
    """The cost of a redraw at full lines and of following a row, and their share of a
    second at ``steps_per_s``."""
    curves = TrainingCurves()
    for step in range(4 * MAX_POINTS):
        curves.add_step({"step": step, "loss": 1 / (step + 1), "lr": 1e-3})
        if step % 100 == 99:
            curves.add_epoch({"steps": step, "val_loss": 1 / step, "val_accuracy": 0.5})
    redraw_s = _median_s(curves.html, 50)
    html_bytes = len(curves.html().encode())
    follower = LiveCurves(_Nowhere(), clock=lambda: 0.0)  # drawn once, then never due
    follower.on_start(RunStart(folder=None, step=0, epoch=0, total_steps=None, epochs=None,
                              max_steps=None, main=True, curves=True))
    row = {"step": 1, "epoch": 0, "loss": 0.5, "lr": 1e-3, "steps_per_s": 800.0,
           "samples_per_s": 51200.0}
    follower.on_step(1, row)
    rows = 20_000

    def follow_rows() -> None:
        for _ in range(rows):
            follower.on_step(1, row)

    row_s = _median_s(follow_rows, 5) / rows
    share = redraw_s + row_s * steps_per_s / LOG_EVERY
    return {"redraw_s": redraw_s, "redraw_html_bytes": html_bytes, "follow_row_s": row_s,
            "share_of_a_second_at_measured_pace": share}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args()
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    kernel = in_the_kernel(rounds, STEPS)
    local = in_this_process(kernel["wall"]["steps_per_s"]["curves"])
    ratio = kernel["cpu"]["curves_vs_bar_only_paired"]
    results = {"machine": {**machine(), "threads": 1, "quick": args.quick}, "goal": GOAL,
               "disabled_by": "progress='bar' (the same progress bar, no curves)",
               "kernel": kernel, "this_process": local, "goal_met": ratio >= GOAL}
    for clock in ("wall", "cpu"):
        figures = kernel[clock]
        low, high = figures["paired_spread"]
        print(f"steps/s of {clock} time in a kernel, median of {rounds} rounds: curves "
              f"{figures['steps_per_s']['curves']:.1f}, bar only "
              f"{figures['steps_per_s']['bar_only']:.1f}; paired ratio "
              f"{figures['curves_vs_bar_only_paired']:.4f} [{low:.4f}-{high:.4f}]")
    print(f"goal: CPU-time paired ratio >= {GOAL}: {'met' if ratio >= GOAL else 'MISSED'}")
    print(f"one redraw {local['redraw_s'] * 1e3:.2f} ms ({local['redraw_html_bytes']:,} bytes), "
          f"one row {local['follow_row_s'] * 1e6:.2f} us: "
          f"{local['share_of_a_second_at_measured_pace'] * 100:.3f}% of a second")
    write_results(RESULTS, results)
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
