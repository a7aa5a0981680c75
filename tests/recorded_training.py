"""A ``fit`` run into a checkpoint folder that says on stdout each step row its record is
told, for test_run_record_process.py to kill; one fresh interpreter per run::

    python tests/recorded_training.py FOLDER [--item-delay SECONDS]

Prints ``logged STEP`` (flushed) as each row reaches the callbacks, and ``done`` when
``fit`` returns. ``--item-delay`` makes each item of the data take that long to load, so
that the run lasts a while.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.loop import fit

SAMPLES, BATCH, EPOCHS = 64, 8, 12


class Slow(Dataset):  # type: ignore[type-arg]
    def __init__(self, delay_s: float) -> None:
        self.inputs = torch.randn(SAMPLES, 6, generator=torch.Generator().manual_seed(5))
        self.delay_s = delay_s

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        return self.inputs[index], self.inputs[index, :3].argmax()


class Saying(Callback):
    """Says each logged row as the run's callbacks hear of it."""

    every_step = False

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        print(f"logged {step}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder")
    parser.add_argument("--item-delay", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(Slow(args.item_delay), batch_size=BATCH, shuffle=True), epochs=EPOCHS,
        device="cpu", checkpoint=args.folder, checkpoint_every_steps=5, log_every=1, seed=1,
        progress=False, callbacks=[Saying()])
    print("done", flush=True)


if __name__ == "__main__":
    main()
