"""``fit`` inside ``launch``: real DDP over gloo in 2 processes on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.train.distributed import launch
from ipycloud.runtime.train.loop import fit

SAMPLES, PER_RANK_BATCH, STEPS = 256, 8, 12


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(5)
    inputs = torch.randn(SAMPLES, 6, generator=generator)
    return TensorDataset(inputs, inputs[:, :3].argmax(dim=1))


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.2)


def train(batch_size: int, folder: str | None) -> dict[str, Any]:
    model, optimizer = model_and_optimizer()
    fit(model, optimizer, DataLoader(dataset(), batch_size=batch_size, shuffle=True),
        max_steps=STEPS, precision="fp32", device="cpu", progress=False, seed=11,
        checkpoint=folder, checkpoint_every_steps=5)
    return {"state": {name: tensor.clone() for name, tensor in model.state_dict().items()},
            "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0}


def test_ddp_training_equals_one_process_on_the_global_batch(tmp_path: Path) -> None:
    ranks = launch(train, PER_RANK_BATCH, str(tmp_path / "ddp"), nprocs=2, backend="gloo")
    single = train(2 * PER_RANK_BATCH, None)["state"]
    assert [result["rank"] for result in ranks] == [0, 1]
    for name, tensor in single.items():
        assert torch.equal(ranks[0]["state"][name], ranks[1]["state"][name]), name
        # Same samples per step, averaged across ranks instead of in one batch: equal up to
        # the order of floating-point additions.
        assert torch.allclose(ranks[0]["state"][name], tensor, atol=1e-6), name
    first, _ = model_and_optimizer()
    assert not torch.allclose(single["0.weight"], first.state_dict()["0.weight"])


def test_only_rank_zero_writes_checkpoints(tmp_path: Path) -> None:
    launch(train, PER_RANK_BATCH, str(tmp_path / "ddp"), nprocs=2, backend="gloo")
    names = [info.name for info in CheckpointManager(tmp_path / "ddp").list()]
    assert names == ["step-000000005", "step-000000010", "step-000000012"]  # one writer


def train_epochs(batch_size: int, folder: str, **options: Any) -> dict[str, Any]:
    model, optimizer = model_and_optimizer()
    history = fit(model, optimizer, DataLoader(dataset(), batch_size=batch_size, shuffle=True),
                  precision="fp32", device="cpu", progress=False, seed=11, checkpoint=folder,
                  **options)
    return {"epochs": [row["epoch"] for row in history.epochs],
            "step": history.steps[-1]["step"]}


def test_a_checkpoint_of_two_processes_at_an_epochs_end_resumes_in_one(tmp_path: Path) -> None:
    """Two ranks stop right after the epoch's last batch; one process goes on from there."""
    folder = str(tmp_path / "ddp")
    steps_per_epoch = SAMPLES // (2 * PER_RANK_BATCH)
    launch(train_epochs, PER_RANK_BATCH, folder, max_steps=steps_per_epoch, nprocs=2,
           backend="gloo")
    saved = CheckpointManager(folder).list()[-1]
    assert (saved.step, saved.epoch) == (steps_per_epoch, 0)
    resumed = train_epochs(2 * PER_RANK_BATCH, folder, epochs=2)
    assert resumed == {"epochs": [0, 1], "step": 2 * steps_per_epoch}
