"""Benchmark: optimizer steps/s of ``fit`` under elastic torchrun, against a hand-written DDP
loop and accelerate's loop doing the same work, and what fit's per-step SIGTERM vote costs.

Goal: at world size 4, ``fit`` runs at least 0.97x the steps/s of the hand-written loop.

Two ``ipycloud torchrun`` agents on this machine stand in for two nodes (c10d rendezvous
on 127.0.0.1, 2 processes each: world size 4, gloo on the CPU, one torch thread a
process; tests/local_nodes.py starts them). One group of workers runs
elastic_throughput_worker.py, which trains each model with each loop in turn, from the
same seeded model, data and AdamW, with batches of 64 a rank split across the ranks as
DistributedSampler splits them, no checkpoints; see that script for the loops. The
models: an MLP of 6.3 MB (its gradient all-reduce weighs) and a small CNN (its
convolutions do); with four workers on two cores a step of either takes 60 to 100 ms.

Steps/s are of the window from step WINDOW_FROM to the last step (the first steps
rebuild DDP's buckets and warm allocators), timed on the first rank; steps/s from the
start of each run (before the model is wrapped, fit's setup included) are kept beside
them. Four workers on two cores, on a machine that other work shares, make wall-clock
rates swing by 20% from run to run, so each is given beside the steps per CPU second of
the four ranks together (every thread of each, gloo's included): what the loop costs the
machine, little moved by what else runs. Rounds interleave the loops (A B C D, then
B C D A, ...) after an untimed round that warms each up; figures are medians over the
rounds with their minimum and maximum, and ratios are paired: the median of each round's
ratio, the two runs seconds apart.

The vote (``StopVote``: one async all-reduce of one number a step on a gloo group of its
own, read a step later) is priced twice: the time fit's thread spends in
``StopVote.agree`` a step, and the paired ratio of fit with the vote to fit with it
replaced (in the workers only) by one that never votes. The vote's all-reduce itself runs
on gloo's threads: the ratios count it, the time in ``agree`` does not.

Needs ``pip install accelerate`` for accelerate's loop (left out without it).
Run: ``python benchmarks/elastic_throughput.py [--quick]`` (about 4 minutes; ``--quick``:
3 rounds of fewer steps, about 2 minutes); results go to
``benchmarks/results/elastic_throughput.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from elastic_cases import CASES, HERE, NODES, PROCESSES_PER_NODE, ROOT, agents_environment
from figures import machine, write_results

sys.path.insert(0, str(ROOT / "tests"))

from local_nodes import LocalNodes

RESULTS = HERE / "results" / "elastic_throughput.json"
WORKER = HERE / "elastic_throughput_worker.py"
ROUNDS, QUICK_ROUNDS = 6, 3
STEPS, QUICK_STEPS = 50, 40
WINDOW_FROM = 10  # steps left out of the timed window
GOAL_FIT_VS_HAND_WRITTEN = 0.97
LOOPS = ("hand_written", "fit", "fit_without_vote", "accelerate")
RUN_TIMEOUT_S = 900
PAIRS = {"fit_vs_hand_written": ("fit", "hand_written"),
         "fit_vs_accelerate": ("fit", "accelerate"),
         "accelerate_vs_hand_written": ("accelerate", "hand_written"),
         "fit_vs_fit_without_vote": ("fit", "fit_without_vote")}


def run_workers(rounds: int, steps: int, loops: list[str], folder: Path) -> dict[str, Any]:
    """Start the two agents on the worker script; what its first rank wrote."""
    out = folder / "runs.json"
    arguments = [str(out), str(rounds), str(steps), ",".join(loops), ",".join(CASES)]
    with LocalNodes(WORKER, arguments, folder / "logs", nproc=PROCESSES_PER_NODE,
                    count=NODES, max_restarts=0,
                    environment=agents_environment(folder / "state")) as nodes:
        codes = nodes.wait(RUN_TIMEOUT_S)
        if codes != [0] * NODES:
            raise SystemExit(f"the workers failed (agents' statuses {codes}):\n{nodes.tail()}")
    runs: dict[str, Any] = json.loads(out.read_text())
    return runs


def rates(run: dict[str, Any]) -> dict[str, float]:
    """Steps/s of one run: over the window, of wall-clock time and of the CPU time of all
    ranks together, and from its start."""
    ends = run["steps_s"]
    steps = len(ends) - WINDOW_FROM
    cpu_s = sum(cpu[-1] - cpu[WINDOW_FROM - 1] for cpu in run["cpu_steps_s_by_rank"])
    return {"wall": steps / (ends[-1] - ends[WINDOW_FROM - 1]), "cpu": steps / cpu_s,
            "from_start": len(ends) / ends[-1]}


def summarise(case: str, runs: list[dict[str, Any]], loops: list[str]) -> dict[str, Any]:
    """The figures of one model over its rounds."""
    mine = [run for run in runs if run["case"] == case]
    samples = {clock: {loop: [rates(run)[clock] for run in sorted(
        (run for run in mine if run["loop"] == loop), key=lambda run: run["round"])]
        for loop in loops} for clock in ("wall", "cpu", "from_start")}
    figures: dict[str, Any] = {"description": CASES[case].description}
    for clock, by_loop in samples.items():
        suffix = "" if clock == "wall" else f"_{clock}"
        figures[f"steps_per_s{suffix}"] = {loop: statistics.median(values)
                                           for loop, values in by_loop.items()}
        figures[f"spread_min_max{suffix}"] = {loop: [min(values), max(values)]
                                              for loop, values in by_loop.items()}
        for name, (top, bottom) in PAIRS.items():
            if clock != "from_start" and top in loops and bottom in loops:
                paired = [a / b for a, b in zip(by_loop[top], by_loop[bottom], strict=True)]
                figures[f"{name}{suffix}"] = statistics.median(paired)
                figures[f"{name}{suffix}_spread"] = [min(paired), max(paired)]
    votes = [seconds for run in mine if run["loop"] == "fit"
             for seconds in run["votes_s"][WINDOW_FROM:]]
    step_s = 1 / figures["steps_per_s"]["fit"]
    figures["vote"] = {"agree_median_s": statistics.median(votes),
                       "agree_mean_s": statistics.mean(votes),
                       "agree_max_s": max(votes),
                       "share_of_step": statistics.mean(votes) / step_s}
    figures["goal_met"] = figures["fit_vs_hand_written"] >= GOAL_FIT_VS_HAND_WRITTEN
    figures["samples"] = samples
    return figures


def lines(case: str, figures: dict[str, Any], rounds: int) -> list[str]:
    """One line a figure."""
    def paired(name: str) -> str:
        low, high = figures[f"{name}_spread"]
        cpu_low, cpu_high = figures[f"{name}_cpu_spread"]
        return (f"{figures[name]:.3f} [{low:.3f}-{high:.3f}], of CPU time "
                f"{figures[f'{name}_cpu']:.3f} [{cpu_low:.3f}-{cpu_high:.3f}]")

    def each(key: str) -> str:
        return ", ".join(
            f"{loop.replace('_', ' ')} {rate:.2f} [{low:.2f}-{high:.2f}]"
            for (loop, rate), (low, high) in zip(figures[f"steps_per_s{key}"].items(),
                                                 figures[f"spread_min_max{key}"].values(),
                                                 strict=True))

    vote = figures["vote"]
    out = [f"{case}: steps/s, median of {rounds} rounds [min-max]: {each('')}",
           f"{case}: steps per CPU second of the four ranks: {each('_cpu')}",
           f"{case}: fit / hand-written, paired: {paired('fit_vs_hand_written')} (goal >= "
           f"{GOAL_FIT_VS_HAND_WRITTEN}: {'met' if figures['goal_met'] else 'MISSED'})"]
    if "fit_vs_accelerate" in figures:
        out += [f"{case}: fit / accelerate, paired: {paired('fit_vs_accelerate')}",
                f"{case}: accelerate / hand-written, paired: "
                f"{paired('accelerate_vs_hand_written')}"]
    out += [f"{case}: SIGTERM vote: {vote['agree_mean_s'] * 1e3:.3f} ms a step in "
            f"StopVote.agree (median {vote['agree_median_s'] * 1e3:.3f} ms, max "
            f"{vote['agree_max_s'] * 1e3:.1f} ms) = {vote['share_of_step']:.2%} of a step",
            f"{case}: fit / fit without the vote, paired: {paired('fit_vs_fit_without_vote')}"]
    return out


def _versions(*packages: str) -> dict[str, str | None]:
    return {package: importlib.metadata.version(package)
            if importlib.util.find_spec(package) else None for package in packages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_ROUNDS} rounds of {QUICK_STEPS} steps")
    args = parser.parse_args()
    rounds, steps = (QUICK_ROUNDS, QUICK_STEPS) if args.quick else (ROUNDS, STEPS)
    loops = list(LOOPS)
    if importlib.util.find_spec("accelerate") is None:
        print("accelerate is not installed, so its loop is left out: pip install accelerate")
        loops.remove("accelerate")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ipycloud-elastic-throughput-") as folder:
        workers = run_workers(rounds, steps, loops, Path(folder))
    models = {case: summarise(case, workers["runs"], loops) for case in CASES}
    results = {
        "machine": {**machine(), **_versions("torch", "accelerate")},
        "settings": {"world_size": workers["world_size"], "nodes": NODES,
                     "processes_per_node": PROCESSES_PER_NODE, "backend": "gloo",
                     "threads_per_process": 1, "rounds": rounds, "steps_per_run": steps,
                     "window_from_step": WINDOW_FROM, "loops": loops, "quick": args.quick},
        "goal_fit_vs_hand_written": GOAL_FIT_VS_HAND_WRITTEN,
        "models": models,
        "seconds": round(time.monotonic() - began, 1),
    }
    write_results(RESULTS, results)
    for case, figures in models.items():
        print("\n".join(lines(case, figures, rounds)))
    print(f"{results['seconds']:.0f} s in all; written to {RESULTS}")


if __name__ == "__main__":
    main()
