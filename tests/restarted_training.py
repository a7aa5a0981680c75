"""A ``fit`` run under torchrun (two ranks on the CPU, gloo) that torchrun restarts once,
for test_run_follow_torchrun.py::

    python -m torch.distributed.run --standalone --nproc-per-node=2 --max-restarts=2 \
        tests/restarted_training.py FOLDER SIGNALS

On its first try, rank 1 waits at step KILLED_AT for the file SIGNALS/kill, then kills
itself with SIGKILL; rank 0 fails in its next collective and torchrun restarts both. On the
restart, rank 0 waits for SIGNALS/resume before it calls ``fit``, which resumes from the
last checkpoint (step 20) and finishes at step 48.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.distributed import run_under_torchrun
from ipycloud.runtime.train.loop import fit

KILLED_AT = 25
WAIT_S = 120.0


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path} after {WAIT_S} s")
        time.sleep(0.05)


class KillRankOne(Callback):
    def __init__(self, signals: Path) -> None:
        self.signals = signals

    def on_step(self, step: int, logs: dict[str, object]) -> None:
        if step == KILLED_AT and os.environ["RANK"] == "1":
            wait_for_file(self.signals / "kill")
            os.kill(os.getpid(), signal.SIGKILL)


def train(folder: str, signals: Path) -> None:
    first_try = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    if not first_try and os.environ["RANK"] == "0":
        wait_for_file(signals / "resume")
    torch.manual_seed(0)
    inputs = torch.randn(256, 6, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(inputs, inputs[:, :3].argmax(dim=1)), batch_size=8,
                      shuffle=True)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=3, device="cpu",
        checkpoint=folder, checkpoint_every_steps=10, log_every=2, seed=1, progress=False,
        callbacks=[KillRankOne(signals)] if first_try else [])


if __name__ == "__main__":
    run_under_torchrun(train, sys.argv[1], Path(sys.argv[2]))
