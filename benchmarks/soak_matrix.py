"""Soak: ``fit`` killed and resumed in every DataLoader x save mode x process count.

The matrix (``tests/soak_cells.py`` says how each cell is run and checked): DataLoader
{no workers, 2 workers, 2 persistent workers, pin_memory=True with 2 workers} x periodic
saves {at once (``CheckpointManager(background="never")``), by a thread
(``background="thread"``), by the writer process (``background="process"``)} x {one
process, ``ipycloud.launch(..., nprocs=2)`` over gloo}: 24 cells. Each cell trains an MLP
on randomly augmented data, uninterrupted; then in another folder, killed with SIGKILL at
a random step after its first acknowledged checkpoint (under ``launch``, the process that
launched); then resumed there to its end, which must equal the uninterrupted run bit for
bit. A run that reports nothing for two minutes is a hang, named with its cell. On a
machine without CUDA, ``pin_memory`` changes nothing but the DataLoader's own path.

Run: ``python benchmarks/soak_matrix.py [--seed N] [--repeat R] [--cell NAME] [--out FILE]``
(about 5 minutes on 2 cores; ``--repeat`` runs the matrix R times with other seeds and
kill steps; ``--cell`` runs the cell of that name alone, as ``soak_training.Training``
describes it, e.g. ``"2 workers / writer process / one process"``); results go to
``benchmarks/results/soak_matrix.json`` (or FILE).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from figures import write_results

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import torch  # noqa: E402
from soak_cells import CELLS, CellResult, run_cell, summary  # noqa: E402
from soak_processes import subreaper  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "soak_matrix.json"


def line(result: CellResult) -> str:
    verdict = "ok" if not result.failures else "FAILED"
    resumed = "-" if result.resumed_from is None else str(result.resumed_from)
    return (f"{result.cell:<58} killed at {result.killed_at_step!s:>3}, acknowledged "
            f"{result.acknowledged!s:>3}, resumed after {resumed:>3}, equal "
            f"{result.equal!s:<5} {result.seconds:5.1f} s  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--cell", choices=[cell.describe() for cell in CELLS],
                        help="this cell alone")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON to write")
    args = parser.parse_args()
    cells = [cell for cell in CELLS if args.cell in (None, cell.describe())]
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    started, load_before = time.monotonic(), os.getloadavg()
    results: list[CellResult] = []
    with (tempfile.TemporaryDirectory(prefix="ipycloud-soak-matrix-", dir="/var/tmp") as base,
          subreaper()):
        for round_ in range(args.repeat):
            for index, cell in enumerate(cells):
                training = dataclasses.replace(cell, seed=rng.randrange(1 << 16))
                result = run_cell(training, Path(base) / f"{round_}-{index}", rng)
                results.append(result)
                print(line(result), flush=True)
                for failure in result.failures:
                    print(f"    {failure}", flush=True)
    totals = summary(results)
    output = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "load_average_before": load_before,
                    "load_average_after": os.getloadavg()},
        "seed": args.seed, "repeat": args.repeat, "cell": args.cell,
        "seconds": round(time.monotonic() - started, 1),
        **totals,
        "cells": [dataclasses.asdict(result) for result in results],
    }
    write_results(args.out, output)
    print(f"{totals['passed']}/{totals['cells_run']} cells passed, {totals['resumed_equal']} "
          f"resumed bitwise equal, {totals['hangs']} hangs, in {output['seconds']:.0f} s; "
          f"written to {args.out}")


if __name__ == "__main__":
    main()
