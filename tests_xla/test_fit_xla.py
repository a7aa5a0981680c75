"""``fit`` on torch_xla's CPU device, for real: bf16, the XLA loader and step, resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.train.loop import fit

SCRIPT = Path(__file__).with_name("xla_training.py")


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(2)
    inputs = torch.randn(192, 8, generator=generator)
    dataset = TensorDataset(inputs, inputs[:, :3].argmax(dim=1))
    return DataLoader(dataset, batch_size=16, shuffle=True)


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
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


def run(*args: object) -> None:
    """``xla_training.py`` in a fresh interpreter: a kernel started anew."""
    result = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_restarted_run_resumes_bit_for_bit_on_xla(tmp_path: Path) -> None:
    run(tmp_path / "straight", 30, tmp_path / "straight.pt")
    run(tmp_path / "stopped", 17, tmp_path / "first-part.pt")
    saved = CheckpointManager(tmp_path / "stopped").list()
    assert [info.step for info in saved] == [10, 17]
    stored = torch.load(saved[-1].data_path, weights_only=True)  # plain CPU tensors
    assert stored["state"]["model"]["0.weight"].device.type == "cpu"
    assert "xla" in saved[-1].rng  # the device's seed travels with the checkpoint
    run(tmp_path / "stopped", 30, tmp_path / "resumed.pt")
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    for name, tensor in straight.items():  # dropout included
        assert torch.equal(resumed[name], tensor), name
    first_part = torch.load(tmp_path / "first-part.pt", weights_only=True)
    assert not torch.equal(first_part["0.weight"], straight["0.weight"])
