"""Benchmark: ``launch``'s ranks' time to their first training step, forked and fresh.

Fresh ranks are what ``launch`` starts once CUDA is initialised in the notebook (here
simulated: ``torch.cuda.is_initialized`` says True in this process, as after
``model.cuda()``): spawned interpreters that import torch and get the function pickled by
value. Each launch runs two gloo ranks on the CPU that train a small MLP with ``fit``; the
figure is the time from calling ``launch`` to the end of rank 0's first optimizer step,
median of the rounds, the two start methods alternating.

Run: ``python benchmarks/bench_launch.py [--quick]`` (about 1 minute); results go to
``benchmarks/results/launch.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from figures import write_results

from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.distributed import launch
from ipycloud.runtime.train.loop import fit

RESULTS = Path(__file__).parent / "results" / "launch.json"
ROUNDS = 7


class FirstStep(Callback):
    every_step = True
    at: float | None = None

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        FirstStep.at = FirstStep.at or time.time()


def train() -> float | None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(20)]
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, epochs=1, device="cpu",
        precision="fp32", progress=False, callbacks=[FirstStep()])
    return FirstStep.at


def to_first_step(fresh: bool) -> float:
    """Seconds from calling launch to rank 0's first step."""
    real = torch.cuda.is_initialized
    if fresh:
        torch.cuda.is_initialized = lambda: True
    try:
        started = time.time()
        first = launch(train, nprocs=2)[0]
    finally:
        torch.cuda.is_initialized = real
    assert first is not None
    return first - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two rounds")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {"forked": [], "fresh": []}
    for round_ in range(2 if args.quick else ROUNDS):
        for kind in (("forked", "fresh") if round_ % 2 == 0 else ("fresh", "forked")):
            samples[kind].append(to_first_step(kind == "fresh"))
    medians = {kind: statistics.median(values) for kind, values in samples.items()}
    results = {"machine": {"torch": torch.__version__, "cores": os.cpu_count(),
                           "load_average_1min": round(os.getloadavg()[0], 2)},
               "ranks": 2, "rounds": len(samples["forked"]),
               "to_first_step_s": medians,
               "fresh_minus_forked_s": medians["fresh"] - medians["forked"],
               "samples": samples}
    write_results(RESULTS, results)
    print(f"launch to rank 0's first step: forked {medians['forked']:.2f} s, fresh (after "
          f"CUDA is up) {medians['fresh']:.2f} s")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
