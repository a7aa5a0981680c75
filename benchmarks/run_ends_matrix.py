"""Every way a run of ``fit`` ends, as a matrix: ends x fronts x kinds of data.

Ends: finishes, early stop, the model raises, NaN loss, NaN metric, one interrupt, two
interrupts, SIGTERM, SIGKILL, ``sys.exit`` in a callback, ``release=True``. Fronts: a
script, a real kernel (shut down, and a fresh one for the rerun), ``launch(nprocs=2)``,
two torchrun agents. Data: a list of batches, a DataLoader without workers, with 2
workers, with persistent workers, ``ipycloud.loader``, pin_memory, a spawn context. How
each cell is run and what is checked after it: ``tests/run_ends.py``. A kernel cell that
finishes trains ten times in its kernel, which must then hold no more processes or
descriptors than after the first time.

Run: ``python benchmarks/run_ends_matrix.py [--jobs N] [--budget-s S] [--front F ...]
[--end E ...] [--data D ...] [--go-on]``; results go to
``benchmarks/results/run_ends_matrix.json``, rewritten after every cell (``--go-on``
keeps the cells it holds, and runs the others: a matrix run in several sittings; the
seconds add up, the budget is this sitting's). Cells are run in an order that tries
every meeting of two (an end and a front, an end and a kind of data, a front and a kind
of data) as early as it can; those a time budget leaves out are listed as not run, with
why. ``--jobs`` runs that many cells at once, each in a process of its own.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import distribution, machine, write_results

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from run_ends import DATA, ENDS, FRONTS, Cell, CellResult, Harness, all_cells

RESULTS = Path(__file__).parent / "results" / "run_ends_matrix.json"
KERNEL_REPEATS = 10
# Cells that make no sense, and why (none so far: release=True inside launch and torchrun
# is run too; it keeps the machine, which its ranks share, and says so).
NOT_APPLICABLE: dict[Cell, str] = {}

_harness: Harness | None = None  # the worker process's


def _start_worker() -> None:
    global _harness
    _harness = Harness().__enter__()


def _run(cell: Cell, base: str) -> dict[str, Any]:
    assert _harness is not None
    with tempfile.TemporaryDirectory(prefix="cell-", dir=base) as folder:
        repeats = KERNEL_REPEATS if (cell.front, cell.end) == ("kernel", "finishes") else 1
        result: CellResult = _harness.run_cell(cell, Path(folder), repeats)
    return {"end": cell.end, "front": cell.front, "data": cell.data, **result.as_dict()}


def covering_order(cells: list[Cell]) -> list[Cell]:
    """``cells`` so that each comes as early as the pairs (end and front, end and data,
    front and data) it is the first to try allow: a run cut short by its budget has tried
    as many meetings as it could. Ties keep the given order."""
    def pairs(cell: Cell) -> set[tuple[str, str]]:
        return {(cell.end, cell.front), (cell.end, cell.data), (cell.front, cell.data)}

    ordered, left = [], list(cells)
    seen: set[tuple[str, str]] = set()
    while left:
        best = max(left, key=lambda cell: len(pairs(cell) - seen))
        ordered.append(best)
        left.remove(best)
        seen |= pairs(best)
    return ordered


def totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "cells_run": len(results),
        "passed": sum(not result["failures"] for result in results),
        "ended_by_itself": sum(result["ended_by_itself"] for result in results),
        "hangs": sum(result["hangs"] for result in results),
        "processes_left": sum(result["processes_left"] for result in results),
        "loader_workers_alive_after_fit": sum(result["workers_after_fit"]
                                              for result in results),
        "descriptors_left_open": sum(result["descriptors_left_open"] for result in results),
        "shared_memory_left": sum(result["shared_memory_left"] for result in results),
        "invalid_records": sum(result["invalid_records"] for result in results),
        "unloadable_checkpoints": sum(result["unloadable_checkpoints"] for result in results),
        "reruns_ok": sum(result["rerun_ok"] for result in results),
        "seconds_to_end": distribution([seconds for result in results
                                        for seconds in result["seconds_to_end"]]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=None)
    parser.add_argument("--front", action="append", choices=FRONTS)
    parser.add_argument("--end", action="append", choices=ENDS)
    parser.add_argument("--data", action="append", choices=DATA)
    parser.add_argument("--go-on", action="store_true",
                        help="keep the cells the results hold and run the others")
    args = parser.parse_args()
    earlier = json.loads(RESULTS.read_text()) if args.go_on else {}
    results: list[dict[str, Any]] = earlier.get("cells", [])
    done = {result["cell"] for result in results}
    cells = covering_order([
        cell for cell in all_cells()
        if cell not in NOT_APPLICABLE and cell.describe() not in done
        and (not args.front or cell.front in args.front)
        and (not args.end or cell.end in args.end)
        and (not args.data or cell.data in args.data)])
    sitting, load_before = time.monotonic(), os.getloadavg()[0]
    began = sitting - earlier.get("seconds", 0.0)  # of the whole matrix, all sittings
    not_run: list[dict[str, str]] = [{"cell": cell.describe(), "why": why}
                                     for cell, why in NOT_APPLICABLE.items()]

    def write() -> None:
        left = [cell for cell in cells
                if cell.describe() not in {result["cell"] for result in results}]
        write_results(RESULTS, {
            "machine": {**machine(), "load_average_1min_at_start": round(load_before, 2)},
            "jobs": args.jobs, "seconds": round(time.monotonic() - began, 1),
            **totals(results), "cells_in_matrix": len(all_cells()),
            "not_run": not_run + [{"cell": cell.describe(),
                                   "why": "the time budget ran out"} for cell in left],
            "cells": results}, indent=1)

    with (tempfile.TemporaryDirectory(prefix="ipycloud-run-ends-", dir="/var/tmp") as base,
          concurrent.futures.ProcessPoolExecutor(args.jobs, initializer=_start_worker)
          as pool):
        pending = iter(cells)
        running: set[concurrent.futures.Future[dict[str, Any]]] = set()
        while True:
            out_of_time = args.budget_s is not None and \
                time.monotonic() - sitting > args.budget_s
            while len(running) < args.jobs and not out_of_time:
                cell = next(pending, None)
                if cell is None:
                    break
                running.add(pool.submit(_run, cell, base))
            if not running:
                break
            done, running = concurrent.futures.wait(
                running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                result = future.result()
                results.append(result)
                verdict = "ok" if not result["failures"] else "FAILED"
                print(f"{result['cell']:<62} {result['seconds']:6.1f} s  {verdict}",
                      flush=True)
                for failure in result["failures"]:
                    print("    " + failure.splitlines()[0][:300], flush=True)
            write()
    write()
    summary = totals(results)
    print(f"{summary['passed']}/{summary['cells_run']} cells passed; ended by itself "
          f"{summary['ended_by_itself']}, processes left {summary['processes_left']}, "
          f"invalid records {summary['invalid_records']}, unloadable checkpoints "
          f"{summary['unloadable_checkpoints']}; written to {RESULTS}")


if __name__ == "__main__":
    main()
