"""``fit`` on torch_xla's CPU device, for real: bf16, the XLA loader and step, resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.train.loop import fit


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(2)
    inputs = torch.randn(192, 8, generator=generator)
    dataset = TensorDataset(inputs, inputs[:, :3].argmax(dim=1))
    return DataLoader(dataset, batch_size=16, shuffle=True)


def model_and_optimizer(dropout: float = 0.1) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}


def test_auto_picks_xla_and_bf16_and_learns(capsys: Any) -> None:
    model, optimizer = model_and_optimizer()
    history = fit(model, optimizer, data(), epochs=4, val_data=data(), progress=True)
    first = next(line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("ipycloud.fit:"))
    assert "on xla:0 (torch_xla is installed)" in first
    assert "bf16 (XLA devices run bfloat16 natively)" in first
    assert next(model.parameters()).device.type == "xla"
    losses = history.table("epochs")["train_loss"]
    assert losses[-1] < losses[0]
    assert history.epochs[-1]["val_accuracy"] > 0.5


def test_checkpoint_and_resume_on_xla(tmp_path: Path) -> None:
    """A resumed run equals the straight one bit for bit, without random ops in the model.

    With dropout it would not: torch_xla advances its device seed whenever a graph that
    draws random numbers runs, so the seed saved in a checkpoint starts a different stream
    than the straight run's after a restart (the restored run is still valid training).
    """
    model, optimizer = model_and_optimizer(dropout=0.0)
    fit(model, optimizer, data(), max_steps=30, checkpoint=tmp_path / "straight",
        checkpoint_every=10, progress=False)
    straight = cpu_state(model)

    model, optimizer = model_and_optimizer(dropout=0.0)
    fit(model, optimizer, data(), max_steps=17, checkpoint=tmp_path / "stopped",
        checkpoint_every=10, progress=False)
    saved = CheckpointManager(tmp_path / "stopped").list()
    assert [info.step for info in saved] == [10, 17]
    stored = torch.load(saved[-1].data_path, weights_only=True)  # plain CPU tensors
    assert stored["state"]["model"]["0.weight"].device.type == "cpu"

    model, optimizer = model_and_optimizer(dropout=0.0)  # a restarted kernel
    fit(model, optimizer, data(), max_steps=30, checkpoint=tmp_path / "stopped",
        checkpoint_every=10, progress=False)
    resumed = cpu_state(model)
    for name, tensor in straight.items():
        assert torch.equal(resumed[name], tensor), name
