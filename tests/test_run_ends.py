"""Every way a run of ``fit`` ends, the short version: a covering subset of the matrix of
``run_ends.py`` (every end, every front and every kind of data at least once, and the
meetings most likely to break). The whole product is ``benchmarks/run_ends_matrix.py``.

Each cell runs for real (a script, a kernel shut down and a fresh one started, two
``launch`` ranks, two torchrun agents), ends its way, and is rerun; see ``run_ends`` for
what is checked after each. A run's processes get LIMIT_S to end here rather than the
matrix's 10 s: a process that hangs never ends, and a loaded machine is slow, not hung.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from run_ends import Cell, Harness

LIMIT_S = 30.0
KERNEL_REPEATS = 3  # times the kernel of a kernel cell trains in all

SHORT: list[Cell] = [
    Cell("finishes", "script", "ipycloud.loader"),  # persistent workers at exit
    Cell("one interrupt", "kernel", "persistent workers"),
    Cell("two interrupts", "launch(nprocs=2)", "spawn context"),
    Cell("SIGTERM", "kernel", "spawn context"),  # the group's SIGKILL takes the tracker
    Cell("one interrupt", "two torchrun agents", "DataLoader, no workers"),  # a step apart
    Cell("SIGTERM", "two torchrun agents", "2 workers"),
    Cell("early stop", "script", "list of batches"),
    Cell("the model raises", "script", "DataLoader, no workers"),
    Cell("NaN loss", "launch(nprocs=2)", "2 workers"),
    Cell("NaN metric", "script", "pin_memory"),
    Cell("SIGKILL", "script", "persistent workers"),
    Cell("SIGKILL", "launch(nprocs=2)", "2 workers"),
    Cell("sys.exit in a callback", "script", "2 workers"),
    Cell("release=True", "script", "DataLoader, no workers"),
]


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with Harness(limit_s=LIMIT_S) as running:
        yield running


@pytest.mark.timeout(900)  # a cell starts kernels, torchrun agents: minutes on a busy machine
@pytest.mark.parametrize("cell", SHORT, ids=lambda cell: cell.describe())
def test_the_run_ends_by_itself_leaves_nothing_and_reruns_as_readme_says(
        cell: Cell, harness: Harness, tmp_path: Path) -> None:
    result = harness.run_cell(cell, tmp_path, repeats=KERNEL_REPEATS)
    assert result.failures == [], "\n".join(result.failures)
    assert result.ended_by_itself and result.rerun_ok
    assert result.status in cell.expected_statuses()
    assert (result.processes_left, result.workers_after_fit, result.descriptors_left_open,
            result.shared_memory_left, result.invalid_records,
            result.unloadable_checkpoints) == (0, 0, 0, 0, 0, 0)


def test_the_short_version_covers_every_end_front_and_kind_of_data() -> None:
    from run_ends import DATA, ENDS, FRONTS

    assert {cell.end for cell in SHORT} == set(ENDS)
    assert {cell.front for cell in SHORT} == set(FRONTS)
    assert {cell.data for cell in SHORT} == set(DATA)
