"""The training the soaks kill: ``fit`` on a seeded MLP whose data draws random augmentation
in DataLoader workers, saving periodic checkpoints, in one process or under ``launch``.

A ``Training`` names one configuration: the DataLoader (no workers, two workers, two
persistent workers, two workers with pinned memory), how periodic saves are written
(``CheckpointManager(background=...)``: at once, by a thread, by the writer process) and
the number of processes. Rank 0 reports every step and every checkpoint ``fit`` tells its
callbacks about (with a digest of the weights after each step where asked), and writes
the final model and optimizer state to a file.
"""

from __future__ import annotations

import hashlib
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from soak_processes import Channel
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ipycloud.runtime.checkpoint import CheckpointInfo, CheckpointManager
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.distributed import launch
from ipycloud.runtime.train.loop import fit

LOADERS: dict[str, dict[str, Any]] = {
    "no workers": {},
    "2 workers": {"num_workers": 2},
    "2 persistent workers": {"num_workers": 2, "persistent_workers": True},
    "pin_memory, 2 workers": {"num_workers": 2, "pin_memory": True},
}
SAVES = {"blocking": "never", "thread writer": "thread", "writer process": "process"}
SAMPLES, BATCH, FEATURES, CLASSES = 192, 16, 32, 8


@dataclass(frozen=True)
class Training:
    """One configuration of the training that is killed and resumed."""

    loader: str = "2 workers"
    save: str = "writer process"
    processes: int = 1
    seed: int = 0
    steps: int = 40
    every: int = 4  # optimizer steps between periodic checkpoints
    width: int = 512  # hidden units: the checkpoint holds ~2*width^2 floats with momentum

    def describe(self) -> str:
        where = "one process" if self.processes == 1 else f"launch, {self.processes} ranks"
        return f"{self.loader} / {self.save} / {where}"


class Augmented(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each item drawn through Python's random, NumPy's global generator and torch's."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(5)
        self.inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
        self.labels = self.inputs[:, :CLASSES].argmax(dim=1)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        flip = -1.0 if random.random() < 0.5 else 1.0
        noise = torch.randn(FEATURES) * 0.1 + float(np.random.standard_normal()) * 0.01
        return self.inputs[index] * flip + noise, self.labels[index]


def build(training: Training) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(training.seed)
    model = nn.Sequential(nn.Linear(FEATURES, training.width), nn.ReLU(), nn.Dropout(0.1),
                          nn.Linear(training.width, training.width), nn.ReLU(),
                          nn.Linear(training.width, CLASSES))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def weights_digest(model: nn.Module) -> str:
    """A digest of every parameter and buffer, bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


class Reporter(Callback):
    """Reports every step (with a digest of the weights where asked) and every checkpoint
    that ``fit`` tells its callbacks about: written, complete, the last one in order."""

    def __init__(self, channel: Channel, model: nn.Module | None) -> None:
        self.channel, self.model = channel, model

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        digest = None if self.model is None else weights_digest(self.model)
        self.channel.report("step", step=step, digest=digest)

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        self.channel.report("saved", step=info.step, name=info.name)


def train(training: Training, folder: Path, channel: Channel, result: Path | None,
          digests: bool = False) -> None:
    """Run (or resume) the training in ``folder``, under ``launch`` for several processes;
    the final state goes to ``result``."""
    if training.processes == 1:
        _fit(training, folder, channel, result, digests)
    else:
        launch(_fit, training, folder, channel, result, digests, nprocs=training.processes,
               backend="gloo")
    channel.report("finished")


def _fit(training: Training, folder: Path, channel: Channel, result: Path | None,
         digests: bool) -> None:
    main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator here
    model, optimizer = build(training)
    loader = DataLoader(Augmented(), batch_size=BATCH, shuffle=True, **LOADERS[training.loader])
    manager = CheckpointManager(folder, background=SAVES[training.save])  # type: ignore[arg-type]
    fit(model, optimizer, loader, max_steps=training.steps, checkpoint=manager,
        checkpoint_every_steps=training.every, device="cpu", precision="fp32", progress=False,
        seed=training.seed, callbacks=[Reporter(channel, model if digests else None)]
        if main else [])
    if main and result is not None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, result)


def checkpoint_digest(training: Training, folder: Path, which: int | str) -> tuple[int, str]:
    """The step and weights digest of a checkpoint, loaded through CheckpointManager."""
    model, _ = build(training)
    info = CheckpointManager(folder).load({"model": model}, which=which, restore_rng=False)
    return info.step, weights_digest(model)
