"""A small, fully seeded CPU training run that can stop mid-epoch and resume from a checkpoint.

Used by test_checkpoint_resume.py, one fresh interpreter per run::

    python tests/checkpoint_training.py --data D --steps N [--out O] [--checkpoints C]
        [--stop-at K] [--resume [--no-restore-rng]]

``D`` holds the tensors ``inputs`` (float) and ``labels`` (class indices), written by the test.

Every step draws from Python's ``random`` and NumPy (input noise), from torch's global
generator (dropout) and from the DataLoader's own generator (shuffling); it trains under
bf16 autocast with a GradScaler, AdamW and an LR schedule. ``--stop-at K`` saves a
checkpoint after step K, with the position in the epoch, and exits. ``--resume`` restores
that checkpoint and goes on to step N, skipping the batches the epoch already consumed.
At the end, the final state of everything is written to ``--out`` for comparison.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager

SEED = 1234
BATCH = 16


def build(data: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Model, optimizer, schedule, scaler and the shuffling generators, all seeded."""
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    features, classes = data["inputs"].shape[1], int(data["labels"].max()) + 1
    model = nn.Sequential(nn.Linear(features, 64), nn.GELU(), nn.Dropout(0.3),
                          nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.3), nn.Linear(64, classes))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=9, gamma=0.6)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=4)
    shuffle = torch.Generator().manual_seed(SEED + 1)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler,
            "shuffle": shuffle,  # the DataLoader's generator, as it is now
            "epoch_shuffle": torch.Generator()}  # its state when the epoch began


def train_step(parts: dict[str, Any], inputs: torch.Tensor, labels: torch.Tensor) -> float:
    """One optimisation step that uses every random generator."""
    noise = torch.from_numpy(np.random.standard_normal(inputs.shape).astype(np.float32))
    inputs = inputs + 0.1 * noise + 0.05 * random.random()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = parts["model"](inputs)
    loss = nn.functional.cross_entropy(logits.float(), labels)
    parts["optimizer"].zero_grad(set_to_none=True)
    parts["scaler"].scale(loss).backward()
    parts["scaler"].step(parts["optimizer"])
    parts["scaler"].update()
    parts["scheduler"].step()
    return float(loss)


def run(args: argparse.Namespace) -> None:
    """Train (or resume) to ``args.steps``, stopping early at ``args.stop_at``."""
    torch.set_num_threads(1)
    data = torch.load(args.data, weights_only=True)
    parts = build(data)
    loader = DataLoader(TensorDataset(data["inputs"], data["labels"]), batch_size=BATCH,
                        shuffle=True, generator=parts["shuffle"])
    manager = CheckpointManager(args.checkpoints, keep_last=2) if args.checkpoints else None
    step, epoch, skip, losses = 0, 0, 0, []
    if args.resume:
        assert manager is not None
        info = manager.load(parts, restore_rng=args.restore_rng)
        step, epoch, skip = info.step, info.data_position["epoch"], info.data_position["batch"]
    while step < args.steps:
        if skip:  # replay this epoch's shuffle, then skip what was consumed
            parts["shuffle"].set_state(parts["epoch_shuffle"].get_state())
        else:
            parts["epoch_shuffle"].set_state(parts["shuffle"].get_state())
        for batch, (inputs, labels) in enumerate(loader):
            if batch < skip:
                continue
            losses.append(train_step(parts, inputs, labels))
            step += 1
            if step == args.stop_at:
                assert manager is not None
                manager.save(parts, step=step, epoch=epoch,
                             data_position={"epoch": epoch, "batch": batch + 1})
                return
            if step == args.steps:
                break
        else:
            epoch, skip = epoch + 1, 0
    final = {name: obj.state_dict() for name, obj in parts.items()
             if name not in ("shuffle", "epoch_shuffle")}
    torch.save({**final, "shuffle": parts["shuffle"].get_state(), "step": step, "epoch": epoch,
                "losses": losses,
                "next_draws": [random.random(), float(np.random.rand()), torch.rand(3)]},
               args.out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoints", type=Path)
    parser.add_argument("--stop-at", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--no-restore-rng", dest="restore_rng", action="store_false")
    run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
