"""Real faults, a few of each: the short versions of the soaks in ``benchmarks/``.

Processes killed with SIGKILL at seeded random moments while they save checkpoints
(``soak_kills``), cells of the DataLoader x save mode x processes matrix killed and
resumed (``soak_cells``), and a cell that saves in the background rerun in this process
(``benchmarks/soak_reruns.py`` reruns it in a real kernel); the fault and SIGTERM soaks
themselves with one case of each kind. Every soak with victims forked from it runs in a
fresh interpreter: a fork of the suite's process would copy whatever its threads (those
other tests left) held at that moment. What a kill lands on varies with the machine; what
is checked holds wherever it lands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from soak_resources import settled
from soak_training import Training
from waiting import wait_for

from ipycloud.runtime.checkpoint import CheckpointManager, writer_process

pytestmark = pytest.mark.skipif(not writer_process.supported(),
                                reason="kills Linux processes and reads /proc")
BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
SOAK_TIMEOUT_S = 600


@pytest.mark.parametrize(("kind", "kills"), [
    ("blocking", 4), ("writer process", 3), ("thread", 4), ("writer killed", 3), ("fit", 3)])
def test_kills_lose_no_acknowledged_checkpoint_and_leave_nothing(
        tmp_path: Path, kind: str, kills: int) -> None:
    found = run_soak(tmp_path, "soak_kill.py", "--kind", kind, "--kills", str(kills),
                     "--seed", "7")
    assert len(found["kills"]) == kills
    assert found["failures"] == []
    assert all(kill["acknowledged"] is not None for kill in found["kills"])
    if kind == "fit":
        assert [kill["resumed_equal"] for kill in found["kills"]] == [True] * kills


@pytest.mark.parametrize("cell", [
    Training(loader="2 workers", save="writer process"),
    Training(loader="2 persistent workers", save="thread writer", processes=2),
    Training(loader="no workers", save="blocking", processes=2),
], ids=Training.describe)
def test_a_matrix_cell_killed_and_resumed_ends_as_the_uninterrupted_run(
        tmp_path: Path, cell: Training) -> None:
    found = run_soak(tmp_path, "soak_matrix.py", "--cell", cell.describe(), "--seed", "11")
    [result] = found["cells"]
    assert result["cell"] == cell.describe()
    assert result["failures"] == []
    assert result["equal"] is True and result["killed_at_step"] is not None
    assert result["resumed_from"] is not None and result["acknowledged"] is not None
    assert result["resumed_from"] >= result["acknowledged"]


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


def run_soak(folder: Path, script: str, *args: str) -> dict[str, Any]:
    """Run ``benchmarks/<script>`` in a fresh interpreter; its results."""
    results = folder / "results.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args,
                           "--out", str(results)], capture_output=True, text=True,
                          timeout=SOAK_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures: dict[str, Any] = json.loads(results.read_text())
    return figures


@pytest.mark.fuse
@pytest.mark.mounts
def test_a_fault_of_each_kind_during_fit_loses_nothing_and_hangs_nothing(
        tmp_path: Path) -> None:
    kinds = run_soak(tmp_path, "soak_faults.py", "--runs", "1", "--seed", "5")["kinds"]
    assert sorted(kinds) == ["EIO", "ENOSPC", "ENOTCONN", "EROFS", "full", "vanished"]
    for kind, soaked in kinds.items():
        figures = soaked["figures"]
        assert figures["faults_injected"] == 1, kind
        problems = {name: figures[name] for name in (
            "crashes", "hangs", "not_trained_exactly", "newest_unloadable", "wrong_last_line",
            "behind_more_than_1", "healed_behind_at_end", "copy_back_never_happens",
            "bare_mount_point_writes", "warning_rule_broken", "rerun_after_refusal_not_exact")
            if figures[name]}
        assert problems == {}, kind


def test_sigterms_during_fit_save_the_last_finished_step_and_resume_exactly(
        tmp_path: Path) -> None:
    configs = run_soak(tmp_path, "soak_sigterm.py", "--sigterms", "3", "--seed", "5")["configs"]
    assert sorted(configs) == ["launch", "one", "workers"]
    for name, config in configs.items():
        figures = config["figures"]
        assert figures["sigterms_delivered"] >= 1, name
        assert (figures["late"], figures["unexpected"], figures["not_ended_by_the_signal"],
                figures["not_the_last_finished_step"]) == ([], [], [], []), name
        assert figures["leftover_processes"] == 0, name
        assert figures["chains_bit_exact"] == figures["chains"] >= 1, name
