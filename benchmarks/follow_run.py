"""Benchmark: what following a run costs the notebook that follows it (``ipycloud.follow``).

Goal: following takes at most 1% of a core, however long the record: each look reads
only what was appended (``log_reader.LogReader`` keeps its place), sums the run up
again and, in a notebook, redraws the curves; ``follow`` spaces the looks so that they
take at most ``BUSY_SHARE`` of a core (one a second while a look costs 10 ms or less).

For records of a run on another host of ``SIZES`` step lines, LOOKS looks each after
ROWS_PER_LOOK lines were appended (a run logging ten rows a second), measured as this
thread's CPU time: the look alone (``RunWatch.look``), the look and the notebook's
redraw (``FollowedCurves.show`` making the HTML of the progress line and the curves),
and the reference: the same look without the incremental reader (every line parsed
afresh, then summed up). From them: the pause ``follow`` takes after such a look, and
the share of a core following takes.

Run: ``python benchmarks/follow_run.py`` (about a minute); results go to
``benchmarks/results/follow_run.json``.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from figures import machine, write_results

from ipycloud.notebook.follow_in_cell import FollowedCurves
from ipycloud.runtime.runs.follow_run import BUSY_SHARE, INTERVAL_S
from ipycloud.runtime.runs.records import parse_record
from ipycloud.runtime.runs.run_watch import RunWatch
from ipycloud.runtime.runs.summary import summarize

SIZES = (1_000, 10_000, 100_000)
LOOKS = 20
ROWS_PER_LOOK = 10
RUN = "a1b2c3d4e5f6"
OUT = Path(__file__).parent / "results" / "follow_run.json"


class Screen:
    """Where the notebook would show the HTML: kept, not sent."""

    def show(self, html: str) -> None:
        self.html = html


def row(number: int, t: float) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": 10 * number, "epoch": number // 1000,
            "loss": 1.0 / number, "lr": 1e-3, "steps_per_s": 100.0, "samples_per_s": 6400.0}


def append(log: Path, lines: list[dict[str, Any]]) -> None:
    with log.open("a") as file:
        file.write("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))


def cpu_ms(work: Callable[[], object]) -> float:
    began = time.thread_time()
    work()
    return (time.thread_time() - began) * 1000


def measure(folder: Path, size: int) -> dict[str, Any]:
    log = folder / f"{size}" / f"{RUN}.jsonl"
    log.parent.mkdir()
    now = time.time()
    start = {"t": now - size / 10, "kind": "start", "run": RUN, "pid": 7, "host": "node-b",
             "step": 0, "epoch": 0, "total_steps": 20 * size, "epochs": 20}
    append(log, [start, *(row(number, now - (size - number) / 10)
                          for number in range(1, size + 1))])
    watch, view = RunWatch(log), FollowedCurves(Screen(), interval=0.0)
    first = cpu_ms(lambda: view.show(watch.summary, watch.look()))
    looks, shown, reference = [], [], []
    for look in range(LOOKS):
        number = size + look * ROWS_PER_LOOK
        append(log, [row(number + index, time.time()) for index in range(1, ROWS_PER_LOOK + 1)])
        began = time.thread_time()
        change = watch.look()
        looked = time.thread_time()
        view.show(watch.summary, change)
        looks.append((looked - began) * 1000)
        shown.append((time.thread_time() - began) * 1000)
        reference.append(cpu_ms(lambda: summarize(log, [
            record for line in log.read_bytes().splitlines()
            if (record := parse_record(line)) is not None])))
    look_ms, shown_ms = statistics.median(looks), statistics.median(shown)
    pause_s = max(INTERVAL_S, shown_ms / 1000 / BUSY_SHARE)
    return {"lines": size + 1, "first_look_and_draw_ms": round(first, 1),
            "look_ms": round(look_ms, 2), "look_and_redraw_ms": round(shown_ms, 2),
            "reference_full_read_ms": round(statistics.median(reference), 2),
            "look_vs_full_read": round(look_ms / statistics.median(reference), 3),
            "pause_between_looks_s": round(pause_s, 2),
            "share_of_a_core": round(shown_ms / 1000 / pause_s, 4)}


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        cases = [measure(Path(folder), size) for size in SIZES]
    for case in cases:
        print(f"{case['lines']:>7} lines: look {case['look_ms']} ms (reading afresh "
              f"{case['reference_full_read_ms']} ms, x{case['look_vs_full_read']}), with the "
              f"redraw {case['look_and_redraw_ms']} ms; a look every "
              f"{case['pause_between_looks_s']} s: {100 * case['share_of_a_core']:.2f}% of a "
              f"core; first look and drawing {case['first_look_and_draw_ms']} ms")
    write_results(OUT, {"goal": f"at most {BUSY_SHARE:.0%} of a core", "cases": cases,
                        "machine": machine()})


if __name__ == "__main__":
    main()
