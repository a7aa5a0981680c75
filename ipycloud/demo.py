"""``ipycloud demo``: what ipycloud does, shown on this machine with built-in defaults.

It prints the environment report, then (when torch is installed) trains a small model on
the CPU, checkpoints it, kills a saving process with SIGKILL mid-write and resumes from
what survived, checking that the resumed run matches the uninterrupted one bit for bit.
Everything happens in a temporary folder, which is removed at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipycloud._version import __version__
from ipycloud.runtime._optional import is_available

_CRASHING_SAVER = """
import sys, torch
from ipycloud.runtime.checkpoint import CheckpointManager
manager = CheckpointManager(sys.argv[1], keep_last=2)
weights = torch.zeros(2_000_000)
for step in range(10**9):
    weights.fill_(step)
    manager.save({"weights": weights}, step)
    if step == 3:
        print("ready", flush=True)
"""


def run_demo(say: Callable[[str], object] = print) -> int:
    """Run the demo, writing its story through ``say``; returns an exit status."""
    from ipycloud.runtime.report import environment_report

    say(f"ipycloud {__version__}: what this machine offers for training\n")
    say(str(environment_report(processes=True)))
    if not is_available("torch"):
        say("\ntorch is not installed: pip install 'ipycloud[torch]' to see checkpoints "
            "survive a crash and resume bit for bit.")
        return 0
    with tempfile.TemporaryDirectory(prefix="ipycloud-demo-") as folder:
        say(f"\nCheckpoints, in the temporary folder {folder}:")
        _survive_a_kill(Path(folder) / "killed", say)
        matches = _resume_bit_for_bit(Path(folder) / "resume", say)
    say("\nIn a notebook: %load_ext ipycloud, then %gpuinfo and %checkpoint? for help.")
    return 0 if matches else 1


def _survive_a_kill(folder: Path, say: Callable[[str], object]) -> None:
    """A process saving in a loop is killed with SIGKILL; the newest complete one loads."""
    import torch

    from ipycloud.runtime.checkpoint import CheckpointManager

    saver = subprocess.Popen([sys.executable, "-c", _CRASHING_SAVER, str(folder)],
                             stdout=subprocess.PIPE, text=True)
    assert saver.stdout is not None
    saver.stdout.readline()  # it has saved a few checkpoints and keeps going
    time.sleep(0.5)
    os.kill(saver.pid, signal.SIGKILL)
    saver.wait()
    left = sorted(path.name for path in folder.iterdir())
    say(f"- a process saving 8 MB checkpoints in a loop was killed with SIGKILL; it left: "
        f"{', '.join(left)}")
    weights = torch.empty(2_000_000)
    info = CheckpointManager(folder, keep_last=2).load({"weights": weights})
    intact = bool((weights == info.step).all())
    say(f"- the newest complete checkpoint, step {info.step}, verified and loaded; "
        f"contents intact: {intact}")


def _resume_bit_for_bit(folder: Path, say: Callable[[str], object]) -> bool:
    """Train 60 steps straight, and 30 + restore + 30; compare every parameter bit."""
    from ipycloud.runtime.checkpoint import CheckpointManager

    started = time.perf_counter()
    straight = _Run()
    straight.train(60)
    first_half = _Run()
    first_half.train(30)
    manager = CheckpointManager(folder, keep_last=2)
    manager.save(first_half.state(), 30, blocking=False)
    manager.wait()
    resumed = _Run(seed=12345)  # different weights and RNG until the restore
    info = manager.load(resumed.state())
    resumed.train(60 - info.step)
    matches = straight.equals(resumed)
    say(f"- 60 training steps straight vs 30 steps, an asynchronous checkpoint, a restore into "
        f"a fresh model and 30 more: identical to the last bit: {matches} "
        f"({time.perf_counter() - started:.1f} s)")
    return matches


class _Run:
    """A small model with dropout, AdamW and a scheduler, trained on fixed synthetic data."""

    def __init__(self, seed: int = 0) -> None:
        import torch

        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                         torch.nn.Dropout(0.2), torch.nn.Linear(64, 1))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=20)
        data = torch.Generator().manual_seed(7)
        self.inputs = torch.randn(512, 16, generator=data)
        self.targets = torch.randn(512, 1, generator=data)

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def train(self, steps: int) -> None:
        import torch

        for _ in range(steps):
            batch = torch.randint(0, len(self.inputs), (32,))  # uses the global torch RNG
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(self.inputs[batch]),
                                                self.targets[batch])
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()

    def equals(self, other: _Run) -> bool:
        import torch

        ours, theirs = self.optimizer.state_dict()["state"], other.optimizer.state_dict()["state"]
        return all(torch.equal(a, b) for a, b in zip(
            self.model.state_dict().values(), other.model.state_dict().values(), strict=True)
        ) and all(torch.equal(ours[key][name], theirs[key][name])
                  for key in ours for name in ours[key])
