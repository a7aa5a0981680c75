"""Benchmark: what the run record costs ``fit`` per optimizer step.

Goal: on each of the three models of bench_fit.py (an MLP, a tiny BERT, a small CNN,
trained on the CPU with one thread, in fp32, with fit's default log_every=10), writing the
run record costs at most 0.5% of a step.

The cost is measured where it is paid: the time ``fit``'s thread spends in the recorder's
calls during the steps (``on_step``, ``on_epoch``, ``on_checkpoint``, ``on_event``, each
call timed with ``perf_counter``) plus the CPU time of the record's own writing thread
over the same lines (``thread_time``), as though that thread took all its time from the
training; per step, against the mean step of the same run (the fit's wall-clock time over
its steps). What a run pays once, at its start (who runs it, the platform, the writing
thread, the index entry written and fsynced) and at its end (waiting up to a second for
the record to reach the disk) is given apart, in milliseconds a run. Each round also
trains once with no record (the recorder left out) beside the recorded run, the order
alternating, and the paired ratio of their steps/s is given as a check; on this shared VM
its spread (several percent) is far wider than the cost itself, so the goal is judged on
the measured cost. Figures are medians over the rounds.

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
from figures import machine, write_results

from ipycloud.runtime.checkpoint.leases import new_run_id
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.appender import Appender
from ipycloud.runtime.runs.recorder import RunRecorder
from ipycloud.runtime.train import loop

RESULTS = Path(__file__).parent / "results" / "run_record.json"
ROUNDS, QUICK_ROUNDS = 7, 2
GOAL_SHARE_OF_STEP = 0.005


PER_RUN = ("on_start", "on_end")  # the recorder's calls made once a run


class CountedAppender(Appender):
    """An Appender whose thread notes its CPU time once the start is written (the index
    entry is the first task) and as it ends."""

    cpu_at_start_s = 0.0
    cpu_s = 0.0

    def call(self, task: Callable[[], object]) -> None:
        def counted() -> None:
            task()
            self.cpu_at_start_s = time.thread_time()

        super().call(counted)

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            self.cpu_s = time.thread_time()


class Timed:
    """A recorder whose calls are timed, by method."""

    def __init__(self, recorder: RunRecorder) -> None:
        self.recorder = recorder
        self.seconds: dict[str, float] = {}

    def __getattr__(self, name: str) -> Callable[..., None]:
        method = getattr(self.recorder, name)

        def timed(*args: Any) -> None:
            began = time.perf_counter()
            try:
                method(*args)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

        return timed


def recorded_fit(case: Case) -> dict[str, Any]:
    """One recorded run: its steps/s and the record's cost on and beside fit's thread."""
    made: list[Timed] = []

    def record(start: Any) -> Timed:
        run = start.run or new_run_id()
        made.append(Timed(RunRecorder(run, start.folder,
                                      CountedAppender(records.log_path(start.folder, run),
                                                      records.encode))))
        return made[-1]

    loop.record_run = record  # type: ignore[assignment]
    seconds = _train(case)
    [timed] = made
    appender = timed.recorder.appender
    appender._thread.join()
    assert isinstance(appender, CountedAppender)
    during_steps = sum(spent for name, spent in timed.seconds.items() if name not in PER_RUN)
    writing = appender.cpu_s - appender.cpu_at_start_s
    cost = during_steps + writing
    return {"steps_per_s": case.steps / seconds, "step_s": seconds / case.steps,
            "fit_thread_s": timed.seconds, "writer_thread_cpu_s": writing,
            "cost_per_step_s": cost / case.steps, "share_of_step": cost / seconds,
            "per_run_s": sum(timed.seconds[name] for name in PER_RUN)
            + appender.cpu_at_start_s}


def unrecorded_fit(case: Case) -> dict[str, float]:
    loop.record_run = lambda start: None
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
            "per_run_s": statistics.median(run["per_run_s"] for run in with_record),
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
                  f"{'met' if figures['goal_met'] else 'MISSED'}); once a run "
                  f"{figures['per_run_s'] * 1e3:.1f} ms; recorded/unrecorded "
                  f"steps/s paired {figures['recorded_vs_unrecorded_paired']:.3f} "
                  f"[{figures['recorded_vs_unrecorded_paired_spread'][0]:.3f}-"
                  f"{figures['recorded_vs_unrecorded_paired_spread'][1]:.3f}]")
    write_results(RESULTS, {
        "machine": {**machine(), "torch": torch.__version__, "threads": THREADS,
                    "rounds": rounds, "quick": args.quick},
        "goal_share_of_step": GOAL_SHARE_OF_STEP, "log_every": loop.LOG_EVERY,
        "models": models})
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
