"""A training script for torchrun: ``fit`` on a small classifier, as a cluster would run it.

Usage: ``elastic_training.py FOLDER OUT EPOCHS CHECKPOINT_EVERY PACE_S``; with
``ELASTIC_BALLAST_MB`` set, the model carries that many MiB of frozen weights. Every rank
appends, after each optimizer step, the ids of the samples it trained on to
``OUT/trained-<pid>.jsonl``; the first rank writes the final weights to ``OUT/final.pt``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ipycloud
from ipycloud.runtime.train.callback import Callback

SAMPLES, FEATURES, PER_RANK_BATCH = 256, 6, 8


class Classifier(nn.Module):
    """Inputs carry each sample's id in their last column; the model notes and drops it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(32, 3))
        self.ids: list[int] = []
        # Weights that never train and make every checkpoint larger (and slower to write)
        ballast = int(float(os.environ.get("ELASTIC_BALLAST_MB", "0")) * 2**20 / 4)
        self.ballast = nn.Parameter(torch.zeros(ballast), requires_grad=False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.ids = inputs[:, -1].long().tolist()
        return self.net(inputs[:, :-1])


class TrainedSamples(Callback):
    """After each optimizer step: which samples this rank trained on, and when."""

    def __init__(self, model: Classifier, out: Path) -> None:
        self.model, self.path = model, out / f"trained-{os.getpid()}.jsonl"
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        line = {"t": time.time(), "pid": os.getpid(), "rank": self.rank, "world": self.world,
                "step": step, "epoch": logs["epoch"], "ids": self.model.ids}
        with open(self.path, "a") as file:
            file.write(json.dumps(line) + "\n")


class Pace(Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        time.sleep(self.seconds)


def train(folder: str, out: str, epochs: int, every: int, pace: float) -> None:
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(SAMPLES, FEATURES, generator=generator)
    inputs = torch.cat([features, torch.arange(SAMPLES, dtype=torch.float32)[:, None]], 1)
    data = DataLoader(TensorDataset(inputs, features[:, :3].argmax(dim=1)),
                      batch_size=PER_RANK_BATCH, shuffle=True)
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    ipycloud.fit(model, optimizer, data, epochs=epochs, device="cpu", precision="fp32",
                 progress=False, seed=11, checkpoint=folder, checkpoint_every_steps=every,
                 callbacks=[TrainedSamples(model, Path(out)), Pace(pace)])
    if torch.distributed.get_rank() == 0:
        torch.save(model.state_dict(), Path(out) / "final.pt")


if __name__ == "__main__":
    folder, out, epochs, every, pace = sys.argv[1:6]
    ipycloud.run_under_torchrun(train, folder, out, int(epochs), int(every), float(pace))
