"""A seeded ``fit`` run that gets a real SIGTERM at a chosen moment, for
test_fit_preemption.py and benchmarks/soak_sigterm.py; one fresh interpreter per run::

    python tests/preempted_training.py FOLDER OUT [--sigterm WHEN] [--workers N] [--launch]
                                       [--fresh-ranks] [--timeline FILE] [--item-delay SECONDS]

WHEN is where the run sends itself SIGTERM: ``first-item`` (before the first step, while
the first batch loads), ``step:K`` (after optimizer step K), ``validation:E`` (while epoch
E is validated), ``workers:E`` (from a DataLoader worker starting for epoch E: the loader
is starting its workers) or ``save:K`` (while the checkpoint of step K is written); or
``interrupt:K``: after step K the second rank (under ``--launch``) sends itself SIGINT, as
torchrun's agent passes a Ctrl-C on to its worker, the other rank getting none. A run
without it trains to the end and writes its final state to OUT (``torch.save``); a run
that gets one ends by the signal. ``--launch`` runs the same in two processes under
``ipycloud.launch``, the signal sent to the launching process; with ``--fresh-ranks``, as
after CUDA is initialised in the launching process (simulated: ``torch.cuda.is_initialized``
says True there), so that the ranks start fresh and get ``train`` pickled by value.
``--timeline`` appends a line ``WHAT TIME`` (``time.time()``) to FILE as the first process
reaches each point: ``fit`` (as fit is called), ``step K`` (after optimizer step K),
``epoch E`` (after epoch E and its validation), ``trained`` (fit returned) and ``written``
(OUT is written); the SIGTERM can then come from outside. ``--item-delay`` makes each item
of the training and validation data take that long to load (a slow data source), so that a
run lasts a while.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ipycloud.runtime.checkpoint import catalog
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.distributed import launch
from ipycloud.runtime.train.loop import fit

SAMPLES, BATCH, EPOCHS, EVERY = 96, 8, 3, 5


class Noisy(Dataset):  # type: ignore[type-arg]
    """Items that draw from torch's generator as they load (an augmentation)."""

    def __init__(self, sigterm_at_first_item: bool, delay_s: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(5)
        self.inputs = torch.randn(SAMPLES, 6, generator=generator)
        self.sigterm_at_first_item = sigterm_at_first_item
        self.delay_s = delay_s

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sigterm_at_first_item:
            self.sigterm_at_first_item = False
            os.kill(os.getpid(), signal.SIGTERM)
        if self.delay_s:
            time.sleep(self.delay_s)
        inputs = self.inputs[index] + 0.01 * torch.randn(6)
        return inputs, inputs[:3].argmax()


class At(Callback):
    """Sends this process SIGTERM after a given optimizer step."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        if step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class InterruptSecondRank(Callback):
    """Sends this process SIGINT after a given optimizer step, in the second rank only."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        if step == self.step and torch.distributed.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGINT)


class ValidationScore:
    """A metric that sends SIGTERM while a given epoch is validated."""

    def __init__(self, epoch: int | None) -> None:
        self.epoch, self.calls = epoch, 0

    def __call__(self, predictions: torch.Tensor, labels: torch.Tensor) -> float:
        if self.calls == self.epoch:
            os.kill(os.getpid(), signal.SIGTERM)
        self.calls += 1
        return float((predictions.argmax(dim=1) == labels).float().mean())


class Timeline(Callback):
    """Appends ``WHAT TIME`` to a file at each point the first process reaches (see the
    module); does nothing without a file."""

    def __init__(self, path: str | None) -> None:
        first = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        self.path = path if first else None

    def note(self, what: str) -> None:
        if self.path is not None:
            with open(self.path, "a") as timeline:
                timeline.write(f"{what} {time.time()!r}\n")

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        self.note(f"step {step}")

    def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        self.note(f"epoch {epoch}")


def train(folder: str, out: str, when: str | None, workers: int,
          timeline_file: str | None = None, item_delay_s: float = 0.0) -> None:
    kind, _, number = (when or "").partition(":")
    at = int(number) if number else None
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
    if kind == "save":
        _sigterm_while_saving(at)
    loader = DataLoader(Noisy(kind == "first-item", item_delay_s), batch_size=BATCH,
                        shuffle=True,
                        num_workers=workers,
                        worker_init_fn=EpochStart(at if kind == "workers" else None,
                                                  os.getpid(), f"{folder}.starts"))
    timeline = Timeline(timeline_file)
    timeline.note("fit")
    fit(model, optimizer, loader, epochs=EPOCHS, scheduler=scheduler, device="cpu",
        checkpoint=folder, checkpoint_every_steps=EVERY, seed=11, progress=False,
        val_data=DataLoader(Noisy(False, item_delay_s), batch_size=32),
        metrics={"score": ValidationScore(at if kind == "validation" else None)},
        callbacks=[At(at if kind == "step" else None),
                   InterruptSecondRank(at if kind == "interrupt" else None), timeline])
    timeline.note("trained")
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out)
    timeline.note("written")


class EpochStart:
    """A worker_init_fn that sends the training process SIGTERM as the loader starts its
    workers for a given epoch (its first worker's starts are counted in a file)."""

    def __init__(self, epoch: int | None, target: int, counter: str) -> None:
        self.epoch, self.target, self.counter = epoch, target, counter

    def __call__(self, worker_id: int) -> None:
        if self.epoch is None or worker_id != 0:
            return
        counter = Path(self.counter)
        starts = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(starts + 1))
        if starts == self.epoch:
            os.kill(self.target, signal.SIGTERM)


def _sigterm_while_saving(step: int | None) -> None:
    """Send this process SIGTERM as the manifest of ``step``'s checkpoint is written."""
    write_manifest = catalog.write_manifest

    def signalling(info: catalog.CheckpointInfo) -> None:
        if info.step == step:
            os.kill(os.getpid(), signal.SIGTERM)
        write_manifest(info)

    catalog.write_manifest = signalling  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--sigterm", default=None)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--launch", action="store_true")
    parser.add_argument("--fresh-ranks", action="store_true")
    parser.add_argument("--timeline", default=None)
    parser.add_argument("--item-delay", type=float, default=0.0)
    args = parser.parse_args()
    options = (args.folder, args.out, args.sigterm, args.workers, args.timeline,
               args.item_delay)
    if args.fresh_ranks:
        torch.cuda.is_initialized = lambda: True  # a fresh rank imports its own torch
    if args.launch:
        launch(train, *options, nprocs=2, backend="gloo")
    else:
        train(*options)


if __name__ == "__main__":
    main()
