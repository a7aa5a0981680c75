"""A run that fails records the checkpoint it waited for: the save begun in the background
just before the failure is in the run's record, and it loads."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.runs import runs
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.loop import fit

SAVED_STEP = 3  # checkpoint_every_steps=3: the background save begins after step 3
FAILING_CALL = SAVED_STEP + 1  # the model's next forward, right after that save began


class FailsOnCall(nn.Linear):
    """A model whose forward does ``failure`` on a given call."""

    def __init__(self, call: int, failure: str) -> None:
        super().__init__(4, 2)
        self.call, self.failure, self.calls = call, failure, 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        outputs = super().forward(inputs)
        if self.calls != self.call:
            return outputs
        if self.failure == "nan":
            return outputs * float("nan")
        raise RuntimeError("the model failed")


class ExitsAfterStep(Callback):
    """A callback that ends the program in ``on_step_end``."""

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        if step == FAILING_CALL:
            sys.exit(3)


def train(folder: Path, model: nn.Module, callbacks: list[Any]) -> None:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=generator),
                         torch.randint(0, 2, (64,), generator=generator))
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=8),
        epochs=1, device="cpu", progress=False, log_every=100, callbacks=callbacks,
        checkpoint=CheckpointManager(folder, background="thread"), checkpoint_every_steps=3)


@pytest.mark.parametrize(("failure", "error"), [
    ("raises", RuntimeError), ("nan", FloatingPointError), ("exits", SystemExit)])
def test_a_failed_run_records_the_background_save_it_waited_for(
        tmp_path: Path, failure: str, error: type) -> None:
    folder = tmp_path / "run"
    model = FailsOnCall(FAILING_CALL if failure != "exits" else 0, failure)
    with pytest.raises(error):
        train(folder, model, [ExitsAfterStep()] if failure == "exits" else [])

    [run] = runs(folder)
    assert run.status == "failed"
    assert [checkpoint["step"] for checkpoint in run.checkpoints] == [SAVED_STEP]
    restored = nn.Linear(4, 2)
    info = CheckpointManager(folder).load({"model": restored}, which=SAVED_STEP, strict=False)
    assert info.step == SAVED_STEP
