"""Benchmark: what the run record costs ``fit`` per optimizer step.

Goal: on each of the three models of bench_fit.py (an MLP, a tiny BERT, a small CNN,
trained on the CPU with one thread, in fp32, with fit's default log_every=10), writing the
run record costs at most 0.5% of a step.

The cost is measured where it is paid: the time ``fit``'s thread spends in the recorder's
calls (each call timed with ``perf_counter``) plus all the CPU time of the record's own
writing thread (``thread_time`` as it ends), as though that thread took its time from the
training; per step, against the mean step of the same run (the fit's wall-clock time over
its steps). Each round also trains once with no record (the recorder left out) beside the
recorded run, the order alternating, and the paired ratio of their steps/s is given as a
check; on this shared VM its spread (several percent) is far wider than the cost itself,
so the goal is judged on the measured cost. Figures are medians over the rounds.

The record goes to a temporary state folder (``$IPYCLOUD_STATE_DIR``) on the local disk.
Run: ``python benchmarks/run_record.py [--quick]`` (about 2 minutes; ``--quick``: about
40 seconds); results go to ``benchmarks/results/run_record.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_fit import CASES, THREADS, Case
from figures import write_results

from ipycloud.runtime.checkpoint.runs import new_run_id
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.appender import Appender
from ipycloud.runtime.runs.recorder import RunRecorder
from ipycloud.runtime.train import loop

RESULTS = Path(__file__).parent / "results" / "run_record.json"
ROUNDS, QUICK_ROUNDS = 7, 2
GOAL_SHARE_OF_STEP = 0.005


class CountedAppender(Appender):
    """An Appender whose thread notes its CPU time as it ends."""

    cpu_s = 0.0

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            self.cpu_s = time.thread_time()


class Timed:
    """A recorder whose calls are timed."""

    def __init__(self, recorder: RunRecorder) -> None:
        self.recorder = recorder
        self.seconds = 0.0
        self.calls = 0

    def __getattr__(self, name: str) -> Callable[..., None]:
        method = getattr(self.recorder, name)

        def timed(*args: Any) -> None:
            began = time.perf_counter()
            try:
                method(*args)
            finally:
                self.seconds += time.perf_counter() - began
                self.calls += 1

        return timed


def recorded_fit(case: Case) -> dict[str, float]:
    """One recorded run: its steps/s and the record's cost on and beside fit's thread."""
    made: list[Timed] = []

    def record(start: Any) -> Timed:
        run = start.run or new_run_id()
        made.append(Timed(RunRecorder(run, start.folder,
                                      CountedAppender(records.log_path(start.folder, run)))))
        return made[-1]

    loop.record_run = record  # type: ignore[assignment]
    seconds = _train(case)
    [timed] = made
    appender = timed.recorder.appender
    appender._thread.join()
    assert isinstance(appender, CountedAppender)
    cost = timed.seconds + appender.cpu_s
    return {"steps_per_s": case.steps / seconds, "step_s": seconds / case.steps,
            "fit_thread_s": timed.seconds, "writer_thread_cpu_s": appender.cpu_s,
            "calls": timed.calls, "cost_per_step_s": cost / case.steps,
            "share_of_step": cost / seconds}


def unrecorded_fit(case: Case) -> dict[str, float]:
    loop.record_run = lambda start: None  # type: ignore[assignment,return-value]
    return {"steps_per_s": case.steps / _train(case)}


def _train(case: Case) -> float:
    model, optimizer, loader = case.parts(case.steps)
    began = time.perf_counter()
    loop.fit(model, optimizer, loader, epochs=1, precision="fp32", device="cpu",
             progress=False)
    return time.perf_counter() - began


def measure(case: Case, rounds: int) -> dict[str, Any]:
    recorded_fit(case)  # warm up allocators and kernels once
    unrecorded_fit(case)
    with_record, without = [], []
    for round_ in range(rounds):
        if round_ % 2:
            without.append(unrecorded_fit(case))
            with_record.append(recorded_fit(case))
        else:
            with_record.append(recorded_fit(case))
            without.append(unrecorded_fit(case))
    share = statistics.median(run["share_of_step"] for run in with_record)
    paired = [recorded["steps_per_s"] / bare["steps_per_s"]
              for recorded, bare in zip(with_record, without, strict=True)]
    return {"description": case.description, "steps_per_run": case.steps,
            "step_s": statistics.median(run["step_s"] for run in with_record),
            "cost_per_step_s": statistics.median(run["cost_per_step_s"] for run in with_record),
            "share_of_step": share, "goal_met": share <= GOAL_SHARE_OF_STEP,
            "recorded_vs_unrecorded_paired": statistics.median(paired),
            "recorded_vs_unrecorded_paired_spread": [min(paired), max(paired)],
            "samples": {"recorded": with_record, "unrecorded": without}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    torch.set_num_threads(THREADS)
    models = {}
    with tempfile.TemporaryDirectory() as state:
        os.environ["IPYCLOUD_STATE_DIR"] = state
        for case in CASES:
            models[case.name] = figures = measure(case, rounds)
            print(f"{case.name:<5} step {figures['step_s'] * 1e3:.2f} ms, record "
                  f"{figures['cost_per_step_s'] * 1e6:.2f} us a step = "
                  f"{figures['share_of_step']:.3%} (goal <= {GOAL_SHARE_OF_STEP:.1%}: "
                  f"{'met' if figures['goal_met'] else 'MISSED'}); recorded/unrecorded "
                  f"steps/s paired {figures['recorded_vs_unrecorded_paired']:.3f} "
                  f"[{figures['recorded_vs_unrecorded_paired_spread'][0]:.3f}-"
                  f"{figures['recorded_vs_unrecorded_paired_spread'][1]:.3f}]")
    write_results(RESULTS, {
        "machine": {"torch": torch.__version__, "threads": THREADS, "rounds": rounds,
                    "quick": args.quick, "cores": os.cpu_count()},
        "goal_share_of_step": GOAL_SHARE_OF_STEP, "log_every": loop.LOG_EVERY,
        "models": models})
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
