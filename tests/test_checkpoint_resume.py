"""Resuming from a mid-epoch checkpoint reproduces the uninterrupted run bit for bit.

Each run is a fresh interpreter running tests/checkpoint_training.py: run A trains N steps
in one go; run B stops after step K in the middle of an epoch, saves and exits, and a new
process restores everything and trains on to N. Their final states must be identical.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import differences

from ipycloud.runtime.checkpoint import CheckpointManager

SCRIPT = Path(__file__).with_name("checkpoint_training.py")
SAMPLES, BATCH = 200, 16  # BATCH as in the script
BATCHES_PER_EPOCH = math.ceil(SAMPLES / BATCH)
STEPS = 2 * BATCHES_PER_EPOCH + 7  # ends in the third epoch
STOP = BATCHES_PER_EPOCH + 4  # the checkpoint falls in the middle of the second


def make_dataset(path: Path) -> None:
    """A synthetic three-class problem from a fixed seed."""
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(SAMPLES, 12, generator=generator)
    labels = (inputs @ torch.randn(12, 3, generator=generator)).argmax(dim=1)
    torch.save({"inputs": inputs, "labels": labels}, path)


def launch(data: Path, *args: str | Path) -> subprocess.Popen[str]:
    """Start one training run in a fresh interpreter."""
    command = [sys.executable, str(SCRIPT), "--data", str(data), "--steps", str(STEPS),
               *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(*processes: subprocess.Popen[str]) -> None:
    """Wait for the runs; each must succeed."""
    for process in processes:
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, f"{process.args}\n{out}\n{err}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Final states of: uninterrupted, resumed, resumed without RNG; and the checkpoints."""
    folder = tmp_path_factory.mktemp("resume")
    data, checkpoints = folder / "data.pt", folder / "checkpoints"
    make_dataset(data)
    finish(launch(data, "--out", folder / "whole.pt"),
           launch(data, "--checkpoints", checkpoints, "--stop-at", STOP))
    saved = CheckpointManager(checkpoints).list()
    finish(launch(data, "--checkpoints", checkpoints, "--resume", "--out", folder / "resumed.pt"),
           launch(data, "--checkpoints", checkpoints, "--resume", "--no-restore-rng",
                  "--out", folder / "no-rng.pt"))
    results = {name: torch.load(folder / f"{name}.pt", weights_only=True)
               for name in ("whole", "resumed", "no-rng")}
    return {**results, "saved": saved}


def test_the_checkpoint_is_in_the_middle_of_an_epoch(runs: dict[str, Any]) -> None:
    [info] = runs["saved"]
    assert info.step == STOP
    assert info.data_position == {"epoch": STOP // BATCHES_PER_EPOCH,
                                  "batch": STOP % BATCHES_PER_EPOCH}
    assert 0 < info.data_position["batch"] < BATCHES_PER_EPOCH
    assert {"python", "numpy", "torch"} <= set(info.rng)
    assert set(info.objects) == {"model", "optimizer", "scheduler", "scaler", "shuffle",
                                 "epoch_shuffle"}


def test_resumed_run_is_bit_identical_to_the_uninterrupted_one(runs: dict[str, Any]) -> None:
    whole, resumed = runs["whole"], runs["resumed"]
    assert whole["step"] == resumed["step"] == STEPS
    assert len(whole["losses"]) == STEPS and len(resumed["losses"]) == STEPS - STOP
    assert resumed["losses"] == whole["losses"][STOP:]
    assert differences(resumed, {**whole, "losses": whole["losses"][STOP:]}) == []
    assert whole["optimizer"]["state"]  # AdamW moments were compared, not an empty dict
    assert whole["scaler"]["scale"] != 2.0 ** 10  # the scaler's state moved during the run


def test_without_rng_restore_the_resumed_run_diverges(runs: dict[str, Any]) -> None:
    whole, diverged = runs["whole"], runs["no-rng"]
    assert diverged["step"] == STEPS
    assert differences(diverged["model"], whole["model"])
    assert differences(diverged["optimizer"]["state"], whole["optimizer"]["state"])
    assert diverged["losses"][0] != whole["losses"][STOP]
    # What does not depend on the random generators still matches.
    assert differences(diverged["scheduler"], whole["scheduler"]) == []
    assert differences(diverged["shuffle"], whole["shuffle"]) == []
