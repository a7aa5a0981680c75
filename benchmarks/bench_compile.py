"""Benchmark: ``fit(compile=...)``'s first step, cold and from saved caches, and compiled
against eager steps/s.

Each figure comes from a fresh interpreter with its own, empty, inductor cache folder (a
new session on a new machine), training a small CNN (three conv layers, 3x32x32 images,
batches of 32) on the CPU with one thread, in fp32:

- ``first_step_s``: from calling ``fit`` to the end of its first optimizer step, with
  ``compile=True`` and no saved caches (``cold``), with the caches a previous session saved
  beside its checkpoints (``warm``), and eagerly (``eager``); goal: warm <= 25% of cold;
- ``steps_per_s``: the steps after the first 10 (compiled and eager), and their ratio;
- ``regional_vs_whole``: a model of 12 alike blocks compiled regionally (one graph serves
  every block) and whole: first step, in wall-clock and CPU seconds (this process and the
  compilers it runs: less moved by other load), and steps/s.

Run: ``python benchmarks/bench_compile.py [--quick]`` (about 8 minutes; ``--quick``: one
round); results go to ``benchmarks/results/compile.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import write_results

RESULTS = Path(__file__).parent / "results" / "compile.json"
GOAL_WARM_VS_COLD = 0.25
STEPS, BATCH, ROUNDS = 60, 32, 3

WORKER = """
import json, os, sys, time, torch
from torch import nn
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.loop import fit

folder, compile_mode, steps, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
torch.manual_seed(0)

class Block(nn.Module):  # a transformer-like layer: norm, MLP, residual
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(64), nn.Linear(64, 256), nn.Linear(256, 64)
    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

if sys.argv[5] == "blocks":
    model = nn.Sequential(nn.Linear(32, 64), nn.Sequential(*[Block() for _ in range(12)]),
                          nn.Linear(64, 10))
    inputs = torch.randn(steps * batch, 32)
else:
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    inputs = torch.randn(steps * batch, 3, 32, 32)
labels = torch.randint(0, 10, (steps * batch,))
batches = [(inputs[i:i + batch], labels[i:i + batch]) for i in range(0, steps * batch, batch)]
times, cpu = [], []

def cpu_s():  # this process and the compilers it ran
    spent = os.times()
    return spent.user + spent.system + spent.children_user + spent.children_system

class Stamps(Callback):
    every_step = True
    def on_step(self, step, logs):
        times.append(time.perf_counter())
        cpu.append(cpu_s())

started, cpu_started = time.perf_counter(), cpu_s()
fit(model, torch.optim.AdamW(model.parameters()), batches, epochs=1, device="cpu",
    precision="fp32", progress=False, checkpoint=folder, callbacks=[Stamps()],
    compile={"eager": False, "compile": True}.get(compile_mode, compile_mode))
print(json.dumps({"first_step_s": times[0] - started, "first_step_cpu_s": cpu[0] - cpu_started,
                  "steps_per_s": (len(times) - 11) / (times[-1] - times[10])}))
"""


def session(folder: Path, mode: str, steps: int, model: str = "cnn") -> dict[str, float]:
    """One fresh interpreter's figures, with an empty inductor cache folder of its own."""
    with tempfile.TemporaryDirectory() as inductor:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor}
        done = subprocess.run([sys.executable, "-c", WORKER, str(folder), mode, str(steps),
                               str(BATCH), model], capture_output=True, text=True, env=env,
                              check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def one_round(scratch: Path, steps: int) -> dict[str, dict[str, float]]:
    """Cold (no caches), warm (a new run beside the caches the cold one saved), eager."""
    cold_folder, warm_folder = scratch / "cold", scratch / "warm"
    cold = session(cold_folder, "compile", steps)
    warm_folder.mkdir()
    shutil.copytree(cold_folder / "compile-cache", warm_folder / "compile-cache")
    warm = session(warm_folder, "compile", steps)
    eager = session(scratch / "eager", "eager", steps)
    return {"cold": cold, "warm": warm, "eager": eager}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round")
    args = parser.parse_args()
    import torch

    rounds: list[dict[str, dict[str, float]]] = []
    for _ in range(1 if args.quick else ROUNDS):
        with tempfile.TemporaryDirectory() as scratch:
            rounds.append(one_round(Path(scratch), STEPS))

    regional_vs_whole: dict[str, list[dict[str, float]]] = {"regional": [], "whole": []}
    for round_ in range(1 if args.quick else ROUNDS):
        for mode in ("regional", "whole") if round_ % 2 == 0 else ("whole", "regional"):
            with tempfile.TemporaryDirectory() as scratch:
                regional_vs_whole[mode].append(session(Path(scratch), mode, 20, "blocks"))

    def median(kind: str, figure: str) -> float:
        return statistics.median(sample[kind][figure] for sample in rounds)

    first = {kind: median(kind, "first_step_s") for kind in ("cold", "warm", "eager")}
    rates = {kind: median(kind, "steps_per_s") for kind in ("cold", "eager")}
    results: dict[str, Any] = {
        "machine": {"torch": torch.__version__, "threads": 1, "cores": os.cpu_count(),
                    "device": "cpu", "load_average_1min": round(os.getloadavg()[0], 2),
                    "when": time.strftime("%Y-%m-%d")},
        "model": "CNN, 3 conv layers, 3x32x32 images, batches of 32, AdamW, fp32",
        "rounds": len(rounds),
        "first_step_s": first,
        "warm_vs_cold": first["warm"] / first["cold"],
        "goal_warm_vs_cold": GOAL_WARM_VS_COLD,
        "steps_per_s": {"compiled": rates["cold"], "eager": rates["eager"]},
        "compiled_vs_eager": rates["cold"] / rates["eager"],
        "samples": rounds,
        "regional_vs_whole": {
            "model": "12 alike blocks (LayerNorm, 64-256-64 MLP, residual), batches of 32",
            "first_step_s": {mode: statistics.median(run["first_step_s"] for run in runs)
                             for mode, runs in regional_vs_whole.items()},
            "first_step_cpu_s": {mode: statistics.median(run["first_step_cpu_s"]
                                                         for run in runs)
                                 for mode, runs in regional_vs_whole.items()},
            "steps_per_s": {mode: statistics.median(run["steps_per_s"] for run in runs)
                            for mode, runs in regional_vs_whole.items()},
            "samples": regional_vs_whole},
    }
    write_results(RESULTS, results)
    print(f"first step: cold {first['cold']:.2f} s, from saved caches {first['warm']:.2f} s "
          f"({results['warm_vs_cold']:.0%} of cold; goal <= {GOAL_WARM_VS_COLD:.0%}), eager "
          f"{first['eager']:.2f} s")
    print(f"steps/s: compiled {rates['cold']:.1f}, eager {rates['eager']:.1f} "
          f"({results['compiled_vs_eager']:.2f}x)")
    blocks = results["regional_vs_whole"]
    print("12 alike blocks, first step: " + ", ".join(
        f"{mode} {blocks['first_step_s'][mode]:.1f} s ({blocks['first_step_cpu_s'][mode]:.1f} "
        f"s of CPU), {blocks['steps_per_s'][mode]:.1f} steps/s" for mode in ("regional", "whole")))
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
