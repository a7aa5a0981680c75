"""Benchmark: what the kernel page's ``api/runs`` routes cost per poll, read from the run
records (``ipycloud.runtime.runs``), with this process's run of ``LINES`` step lines and
``OTHERS`` finished runs of other processes in the user's index, each as long.

The page asks ``api/runs`` and ``api/runs/<id>?since=<its last record>`` once per reading
(every second by default); each answer is measured ``REPEATS`` times in this process
(encoding included, HTTP left out), with no other run in the index and with ``OTHERS``.

Run: ``python benchmarks/bench_page_runs.py`` (under a minute); results go to
``benchmarks/results/page_runs.json``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import machine, write_results

from ipycloud.runtime.monitor.page_runs import run_answer, runs_answer

LINES = 5_000  # step lines of each run: a long run logged every few steps
OTHERS = 20
REPEATS = 20
T0 = 1_732_410_000.0
OUT = Path(__file__).parent / "results" / "page_runs.json"


def write_run(state: Path, run: str, pid: int, ended: bool) -> float:
    """A run's log and index entry; the time of its last line."""
    log = state / "logs" / f"{run}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, Any]] = [{
        "t": T0, "kind": "start", "run": run, "pid": pid, "host": socket.gethostname(),
        "kernel": None, "notebook": "train.ipynb", "step": 0, "epoch": 0,
        "total_steps": 2 * LINES, "epochs": 1}]
    lines += [{"t": T0 + step, "kind": "step", "step": step, "epoch": 0, "loss": 1 / step,
               "lr": 0.1, "steps_per_s": 1.0, "samples_per_s": 8.0}
              for step in range(1, LINES + 1)]
    if ended:
        lines.append({"t": T0 + LINES + 1, "kind": "end", "status": "finished",
                      "reason": None, "step": LINES, "epoch": 1, "best": None})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    index = state / "runs" / "index" / f"{run}.json"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(json.dumps({"run": run, "log": str(log), "pid": pid,
                                 "host": socket.gethostname(), "kernel": None, "started": T0}))
    return float(lines[-1]["t"])


def timed_ms(call: Any) -> dict[str, float]:
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


def measure(state: Path, mine: str, last: float) -> dict[str, dict[str, float]]:
    return {"runs": timed_ms(runs_answer),
            "run_since_last": timed_ms(lambda: run_answer(mine, last))}


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder)
        os.environ["IPYCLOUD_STATE_DIR"] = str(state)
        mine = "a1b2c3d4e5f6"
        last = write_run(state, mine, os.getpid(), ended=False)
        alone = measure(state, mine, last)
        for number in range(OTHERS):
            write_run(state, f"{number:012x}", os.getppid(), ended=True)
        crowded = measure(state, mine, last)
    results = {"lines_per_run": LINES, "other_runs": OTHERS, "repeats": REPEATS,
               "this_run_alone": alone, f"with_{OTHERS}_other_runs": crowded,
               "machine": machine()}
    print(json.dumps(results, indent=2))
    write_results(OUT, results)


if __name__ == "__main__":
    main()
