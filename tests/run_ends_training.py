"""The training of the run-ends matrix (``run_ends.py``): one ``fit`` that ends one way,
run as a script, in a kernel, under ``launch(nprocs=2)`` or under torchrun::

    python tests/run_ends_training.py SPEC.json

The spec (a ``run_ends.Spec`` as JSON) names the end, the data, the front and the cell's
folder. Files in ``<folder>/signals`` tell the driver where the run is: ``reached`` once
the first rank is at step END_AT (where a signal is due; the run then waits there for
``go``), and ``after-fit-<pid>.json`` in each process that called ``fit`` as it
returned or raised: what it still had running (children), and the descriptors it opened.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ipycloud
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.early_stopping import EarlyStopping

SAMPLES, FEATURES, BATCH, EPOCHS = 32, 6, 8, 3  # 12 steps; 6 under launch and torchrun
END_AT = 3  # the step at which the run is made to end
CHECKPOINT_EVERY = 2
SETTLE_S = 5.0
WAIT_S = 120.0  # how long a run waits at END_AT for a checkpoint, for the driver's signal
SIGNALLED = ("one interrupt", "two interrupts", "SIGTERM", "SIGKILL")


class Model(nn.Module):
    """A small classifier that fails on demand: raises, or gives NaN outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 3))
        self.failure: str | None = None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.failure == "raise":
            raise RuntimeError("the model failed on purpose")
        outputs: torch.Tensor = self.net(inputs)
        return outputs * math.nan if self.failure == "nan" else outputs


def flat(predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """A validation metric that never improves: early stopping ends the run."""
    return 1.0


def undefined(predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """A metric that is NaN, as an R² or F1 of a degenerate set is."""
    return math.nan


def dataset() -> TensorDataset:
    features = torch.randn(SAMPLES, FEATURES, generator=torch.Generator().manual_seed(5))
    return TensorDataset(features, features[:, :3].argmax(dim=1))


def train_data(kind: str) -> Any:
    """The training data of ``kind`` (one of run_ends.DATA)."""
    data = dataset()
    if kind == "list of batches":
        return [(data.tensors[0][i:i + BATCH], data.tensors[1][i:i + BATCH])
                for i in range(0, SAMPLES, BATCH)]
    if kind == "ipycloud.loader":
        return ipycloud.loader(data, batch_size=BATCH)
    options: dict[str, dict[str, Any]] = {
        "DataLoader, no workers": {},
        "2 workers": {"num_workers": 2},
        "persistent workers": {"num_workers": 2, "persistent_workers": True},
        "pin_memory": {"num_workers": 2, "pin_memory": True},
        # One worker, kept: each spawned worker imports torch afresh, which takes seconds.
        "spawn context": {"num_workers": 1, "persistent_workers": True,
                          "multiprocessing_context": "spawn"},
    }
    return DataLoader(data, batch_size=BATCH, shuffle=True, **options[kind])


class EndAt(Callback):
    """At step END_AT of a run whose end is armed, once a checkpoint of the run is
    committed (a background save may take a while) and the run is on record: end it as
    ``end`` says, or, for an end the driver brings (a signal), say so and wait for the
    driver's ``go``."""

    def __init__(self, end: str, model: Model, signals: Path, checkpoint: Path) -> None:
        self.end, self.model, self.signals, self.checkpoint = end, model, signals, checkpoint

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        if step != END_AT or self.end == "finishes":
            return
        _wait_for(lambda: any(self.checkpoint.glob("step-*.json")))
        # and the record's first line written (at once, but by a thread of its own that a
        # busy machine may hold back): a kill must find the run on record
        _wait_for(lambda: any(log.stat().st_size for log in
                              self.checkpoint.glob(".ipycloud-runs/*.jsonl")))
        if self.end == "the model raises":
            self.model.failure = "raise"
        elif self.end == "NaN loss":
            self.model.failure = "nan"
        elif self.end == "sys.exit in a callback":
            sys.exit(3)
        elif self.end in SIGNALLED:
            if _rank() == 0:
                _write(self.signals / "reached", str(os.getpid()))
            _wait_for((self.signals / "go").exists)


def _write(path: Path, text: str) -> None:
    """Write ``path`` whole at once (the driver reads it as soon as it is there)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


HELD_BATCH = "/dev/shm/torch_"  # a tensor's storage a worker sent through shared memory


def _descriptors() -> dict[str, str]:
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor
            continue
    return found


NOT_WORKERS = ("writer_child", "multiprocessing.resource_tracker")


def _workers() -> list[psutil.Process]:
    """This process's live descendants but its helpers that serve it, not the data, and
    end with it: the checkpoint writer process, multiprocessing's resource tracker."""
    return [child for child in psutil.Process().children(recursive=True)
            if child.status() != psutil.STATUS_ZOMBIE
            and not any(helper in part for part in child.cmdline() for helper in NOT_WORKERS)]


def _note_after_fit(signals: Path, before: dict[str, str], failed: bool) -> None:
    """What this process holds as ``fit`` has returned or raised: its live children (the
    loaders' workers must be gone) and, in a process alone (a rank's are the group's),
    the descriptors ``fit`` left open: after SETTLE_S for what ends a moment later (a
    worker being reaped, the record's file closed by its writer thread), the data
    dropped first. Where ``fit`` raised, the traceback holds the batch the run failed on,
    for inspection: its tensors' shared memory is not counted, every pipe, socket and
    file is."""
    ended_at = time.time()
    deadline = time.monotonic() + SETTLE_S
    while True:
        children = _workers()
        after = {} if torch.distributed.is_initialized() else _descriptors()
        opened = sorted(target for fd, target in after.items() if before.get(fd) != target
                        and not (failed and target.startswith(HELD_BATCH)))
        if not (children or opened) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    note = {"t": ended_at, "pid": os.getpid(), "rank": _rank(),
            "children": [" ".join(child.cmdline())[:200] for child in children],
            "descriptors_opened": opened}
    _write(signals / f"after-fit-{os.getpid()}.json", json.dumps(note))


def train(spec: dict[str, Any]) -> None:
    """One call of ``fit`` as the spec says, noting what it leaves."""
    signals = Path(spec["folder"]) / "signals"
    torch.manual_seed(0)
    model = Model()
    end = spec["end"] if spec["armed"] else "finishes"
    validation: dict[str, Any] = {}
    callbacks: list[Callback] = [EndAt(end, model, signals, Path(spec["checkpoint"]))]
    if spec["end"] in ("early stop", "NaN metric"):
        validation["val_data"] = train_data("list of batches")[:2]
        validation["metrics"] = {"score": flat if spec["end"] == "early stop" else undefined}
    if spec["end"] == "early stop":
        callbacks.append(EarlyStopping("val_score", patience=1, mode="min"))
    data = train_data(spec["data"])
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # the group's connections are made: they are not fit's
    before = _descriptors()
    failed = True
    try:
        ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=EPOCHS,
                     loss_fn=nn.functional.cross_entropy, device="cpu", precision="fp32",
                     checkpoint=spec["checkpoint"], checkpoint_every_steps=CHECKPOINT_EVERY,
                     log_every=2, progress=False, seed=1,
                     release=spec["end"] == "release=True",
                     callbacks=callbacks, **validation)
        failed = False
    finally:
        del data  # a spawned worker got its tensors in shared memory: the user's, not fit's
        gc.collect()  # (a loader's iterator is a reference cycle: freed by the collector)
        _note_after_fit(signals, before, failed)


def main(spec_path: str) -> None:
    """Run the spec at ``spec_path`` on its front (a script and a kernel call this)."""
    spec = json.loads(Path(spec_path).read_text())
    if spec["front"] == "launch(nprocs=2)":
        ipycloud.launch(train, spec, nprocs=2)
    elif spec["front"] == "two torchrun agents":
        ipycloud.run_under_torchrun(train, spec)
    else:
        train(spec)


if __name__ == "__main__":
    main(sys.argv[1])
