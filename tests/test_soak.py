"""Real faults, a few of each: the short versions of the soaks in ``benchmarks/``.

Processes killed with SIGKILL at seeded random moments while they save checkpoints
(``soak_kills``), cells of the DataLoader x save mode x processes matrix killed and
resumed (``soak_cells``), and a cell that saves in the background rerun in this process
(``benchmarks/soak_reruns.py`` reruns it in a real kernel). What a kill lands on varies
with the machine; what is checked holds wherever it lands.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from soak_cells import run_cell
from soak_kills import Soak
from soak_processes import subreaper
from soak_resources import settled
from soak_training import Training
from waiting import wait_for

from ipycloud.runtime.checkpoint import CheckpointManager, writer_process

pytestmark = pytest.mark.skipif(not writer_process.supported(),
                                reason="kills Linux processes and reads /proc")


@pytest.fixture
def reaping() -> Iterator[None]:
    """Orphans of killed processes come to this one, which reaps them as init would."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the victims are forked from this process
    with subreaper():
        yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("kind", "kills"), [
    ("blocking", 4), ("writer process", 3), ("thread", 4), ("writer killed", 3), ("fit", 3)])
def test_kills_lose_no_acknowledged_checkpoint_and_leave_nothing(
        tmp_path: Path, reaping: None, kind: str, kills: int) -> None:
    found = Soak(tmp_path, seed=7, progress=lambda line: None).run({kind: kills})
    assert len(found) == kills
    assert {index: kill.failures() for index, kill in enumerate(found)
            if kill.failures()} == {}
    assert all(kill.acknowledged is not None for kill in found)
    if kind == "fit":
        assert [kill.resumed_equal for kill in found] == [True] * kills


@pytest.mark.parametrize("cell", [
    Training(loader="2 workers", save="writer process"),
    Training(loader="2 persistent workers", save="thread writer", processes=2),
    Training(loader="no workers", save="blocking", processes=2),
], ids=Training.describe)
def test_a_matrix_cell_killed_and_resumed_ends_as_the_uninterrupted_run(
        tmp_path: Path, reaping: None, cell: Training) -> None:
    result = run_cell(dataclasses.replace(cell, seed=11), tmp_path, random.Random(3))
    assert result.failures == []
    assert result.equal is True and result.killed_at_step is not None
    assert result.resumed_from is not None and result.acknowledged is not None
    assert result.resumed_from >= result.acknowledged


def test_reruns_that_drop_their_manager_hold_one_region_and_one_writer(tmp_path: Path) -> None:
    """Each rerun of a cell builds a manager and saves in the background, never closing
    it: the one it replaces lets go of its region, thread and writer process."""
    folder = tmp_path / "run"
    state = {"model": torch.randn(1 << 20)}
    readings = []
    for rerun in range(10):
        manager = CheckpointManager(folder)
        manager.save(state, step=manager.next_step(), blocking=False)
        wait_for(lambda: (folder / f"step-{rerun:09d}.json").exists(),  # noqa: B023
                 timeout=60, what=f"rerun {rerun}'s checkpoint")
        readings.append(settled(os.getpid()))
    first = readings[0]
    assert (first.memfd_regions, first.memfd_descriptors, first.children) == (1, 2, 1)
    assert readings == [first] * len(readings)
    manager.close()
