"""The training script that elastic_restart.py runs on every rank under torchrun.

Usage: ``elastic_restart_worker.py FOLDER TIMELINE CHECKPOINT_EVERY CASE``: ``fit`` of
CASE (see elastic_cases.py) with checkpoints in FOLDER every CHECKPOINT_EVERY steps,
for as long as the benchmark lets it run (it kills the agents at the end). Each process
appends what it has reached, with the wall-clock time, to ``TIMELINE/<pid>.jsonl``:

- ``created``: the process was created (its start time, as the kernel gives it);
- ``started``: the script runs (the interpreter is up);
- ``imported``: torch (with torch._dynamo, which building an optimizer imports) and
  ipycloud's training loop are imported;
- ``group``: the process group is initialised (every rank has joined);
- ``fit``: fit is called (the model and data are built);
- ``settled``: the pass that settles DDP's buckets of a resumed run is over;
- ``step``: an optimizer step ended (``step`` names it).

Where the checkpoint had been loaded when the steps began is in the run record, written by
the first rank (``FOLDER/.ipycloud-runs/<run>.jsonl``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from ipycloud.runtime.train.callback import Callback

_timeline: Path | None = None


def mark(what: str, at: float | None = None, **fields: Any) -> None:
    """Note that this process reached ``what`` (now, or at ``at``)."""
    assert _timeline is not None
    line = {"t": time.time() if at is None else at, "mark": what, "pid": os.getpid(),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            "rank": int(os.environ.get("RANK", -1)), **fields}
    with open(_timeline / f"{os.getpid()}.jsonl", "a") as file:
        file.write(json.dumps(line) + "\n")


class StepMarks(Callback):
    """fit's callback: a ``step`` mark after each optimizer step."""

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        mark("step", step=step)


def train(folder: str, every: int, case_name: str) -> None:
    import torch
    from elastic_cases import CASES

    import ipycloud
    from ipycloud.runtime.train import loop

    mark("group")
    torch.set_num_threads(1)
    case = CASES[case_name]
    model = case.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(case.dataset(steps=25), batch_size=case.batch,
                                       shuffle=True)
    settle = loop.settle_buckets

    def settle_and_mark(*args: Any) -> None:
        settle(*args)
        mark("settled")

    loop.settle_buckets = settle_and_mark  # type: ignore[assignment]
    mark("fit")
    ipycloud.fit(model, optimizer, data, epochs=10_000, device="cpu", precision="fp32",
                 progress=False, seed=11, checkpoint=folder, checkpoint_every_steps=every,
                 callbacks=[StepMarks()])


if __name__ == "__main__":
    _timeline = Path(sys.argv[2])
    mark("created", at=psutil.Process().create_time())
    mark("started")
    # timed here, as a training script's imports: torch, torch._dynamo (which building
    # an optimizer imports, a second of CPU), and the loop that ipycloud.fit imports
    import torch._dynamo  # noqa: F401

    import ipycloud
    import ipycloud.runtime.train.loop

    mark("imported")
    ipycloud.run_under_torchrun(train, sys.argv[1], int(sys.argv[3]), sys.argv[4])
