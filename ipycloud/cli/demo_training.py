"""The training run of ``ipycloud demo``, as a script: run, killed, rerun, compared.

    python -m ipycloud.cli.demo_training DATA CHECKPOINTS OUT [--kill-after-checkpoint N]
                                     [--steps S] [--precision P] [--device D]

It trains a small MLP with dropout on the dataset in DATA (synthetic, made by the
caller), shuffled, with AdamW, a scheduler, mixed precision and gradient accumulation,
on the best local device, checkpointing every 7
steps into CHECKPOINTS (in the background). With --kill-after-checkpoint it SIGKILLs itself
once its N-th checkpoint is written, usually while the next one is being written: the
harshest way a kernel dies. Run again, it resumes from what survived. At the end it writes
the final model and optimizer states to OUT.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.loop import fit


class KillAfterCheckpoint(Callback):
    """A callback that kills this process with SIGKILL once N checkpoints are reported."""

    def __init__(self, count: int) -> None:
        self.count = count

    def on_checkpoint(self, info: Any) -> None:
        self.count -= 1
        if self.count == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("checkpoints")
    parser.add_argument("out")
    parser.add_argument("--kill-after-checkpoint", type=int)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = torch.load(args.data, weights_only=True)
    dataset = TensorDataset(data["inputs"], data["labels"])
    model = torch.nn.Sequential(torch.nn.Linear(data["inputs"].shape[1], 32), torch.nn.ReLU(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    callbacks: list[Callback] = ([KillAfterCheckpoint(args.kill_after_checkpoint)]
                 if args.kill_after_checkpoint else [])
    history = fit(model, optimizer, DataLoader(dataset, batch_size=8, shuffle=True),
                  max_steps=args.steps, scheduler=scheduler, precision=args.precision,
                  grad_accum=2, device=args.device, checkpoint=args.checkpoints,
                  checkpoint_every_steps=7, callbacks=callbacks, progress=args.progress)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "steps": [row["step"] for row in history.steps]}, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
