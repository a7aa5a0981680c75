"""The training script that elastic_throughput.py runs on every rank under torchrun.

Usage: ``elastic_throughput_worker.py OUT ROUNDS STEPS LOOPS CASES`` (LOOPS and CASES
comma-separated). Every round trains each case with each loop for STEPS optimizer steps,
from the same seeded model, data and AdamW, the loops' order rotated from round to round;
an untimed round of WARM_UP_STEPS steps comes first. The loops:

- ``hand_written``: the model in DistributedDataParallel, a DataLoader over a
  DistributedSampler, ``loss.backward(); optimizer.step(); optimizer.zero_grad()``, the
  loss read every 10 steps (as fit reads it);
- ``fit``: ``ipycloud.fit(max_steps=STEPS)`` on a shuffled DataLoader (fit wraps the
  model in DDP and splits the data as DistributedSampler does), no checkpoint;
- ``fit_without_vote``: the same, with fit's per-step SIGTERM vote (``StopVote``) replaced
  in this process by one that never votes;
- ``accelerate``: ``Accelerator(cpu=True).prepare`` of the model, AdamW and a shuffled
  DataLoader (accelerate wraps the model in DDP and gives each rank its own batches),
  ``accelerator.backward(loss)``.

Each run notes, on every rank, the time at its start (before the model is wrapped) and at
the end of each step, wall-clock and the process's CPU time (all its threads, gloo's
included); in the fit runs also the time ``StopVote.agree`` took at each step. The first
rank writes them all to OUT as JSON: its own times, and every rank's CPU times.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from elastic_cases import CASES, Case
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import ipycloud
from ipycloud.runtime.train import loop, stop_vote
from ipycloud.runtime.train.callback import Callback

WARM_UP_STEPS = 20
LOG_EVERY = 10  # steps between reads of the loss, in every loop (fit's default)
SEED = 0


class Run(Callback):
    """The times of one run: its start and each step's end (wall-clock and this process's
    CPU time), and the time each vote took."""

    def __init__(self) -> None:
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.step_ends: list[float] = []
        self.cpu_step_ends: list[float] = []
        self.votes: list[float] = []

    def step_ended(self) -> None:
        self.step_ends.append(time.perf_counter())
        self.cpu_step_ends.append(time.process_time())

    def on_step(self, step: int, logs: dict[str, Any]) -> None:  # as fit's callback
        self.step_ended()

    def as_record(self) -> dict[str, Any]:
        return {"steps_s": [round(end - self.started, 6) for end in self.step_ends],
                "cpu_steps_s": [round(end - self.cpu_started, 6) for end in self.cpu_step_ends],
                "votes_s": [round(seconds, 7) for seconds in self.votes]}


def hand_written(case: Case, steps: int) -> Run:
    from torch.nn.parallel import DistributedDataParallel

    dataset = case.dataset(steps)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, shuffle=True, seed=SEED)
    sampler.set_epoch(0)
    loader = DataLoader(dataset, batch_size=case.batch, sampler=sampler)
    raw = case.model()
    optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-3)
    run = Run()
    model = DistributedDataParallel(raw)
    return _steps(run, model, optimizer, loader, steps, lambda loss: loss.backward())


def _steps(run: Run, model: nn.Module, optimizer: torch.optim.Optimizer, loader: Any,
           steps: int, backward: Callable[[torch.Tensor], None]) -> Run:
    """``steps`` optimizer steps of a plain loop, ``backward(loss)`` computing the
    gradients; ``run`` notes when each ends."""
    for step, (inputs, labels) in enumerate(loader):
        if step == steps:  # accelerate pads each rank's share to whole batches
            break
        loss = nn.functional.cross_entropy(model(inputs), labels)
        backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % LOG_EVERY == 0:
            loss.item()  # a loop that shows its loss reads it now and then, as fit does
        run.step_ended()
    return run


def with_fit(case: Case, steps: int, vote: type[Any] = stop_vote.StopVote) -> Run:
    dataset = case.dataset(steps)
    model = case.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=case.batch, shuffle=True)
    run = Run()
    loop.StopVote = _timed_votes(vote, run.votes)  # type: ignore[misc]
    try:
        ipycloud.fit(model, optimizer, loader, max_steps=steps, device="cpu",
                     precision="fp32", progress=False, seed=SEED, callbacks=[run])
    finally:
        loop.StopVote = stop_vote.StopVote  # type: ignore[misc]
    return run


class NoVote:
    """A StopVote that never votes: fit without its per-step all-reduce."""

    def __init__(self, rank: int) -> None:
        pass

    def agree(self, asked: bool) -> int | None:
        return None

    def close(self) -> None:
        pass


def _timed_votes(vote: type[Any], times: list[float]) -> type[Any]:
    """``vote``, each call of its ``agree`` timed into ``times``."""

    class Timed(vote):
        def agree(self, asked: bool) -> int | None:
            started = time.perf_counter()
            try:
                return super().agree(asked)
            finally:
                times.append(time.perf_counter() - started)

    return Timed


def with_accelerate(case: Case, steps: int) -> Run:
    from accelerate import Accelerator

    dataset = case.dataset(steps)
    raw = case.model()
    optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=case.batch, shuffle=True,
                        generator=torch.Generator().manual_seed(SEED))
    run = Run()
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(raw, optimizer, loader)
    return _steps(run, model, optimizer, loader, steps, accelerator.backward)


LOOPS: dict[str, Callable[[Case, int], Run]] = {
    "hand_written": hand_written, "fit": with_fit,
    "fit_without_vote": lambda case, steps: with_fit(case, steps, NoVote),
    "accelerate": with_accelerate}


def train(out: Path, rounds: int, steps: int, loops: list[str], cases: list[str]) -> None:
    torch.set_num_threads(1)
    runs: list[dict[str, Any]] = []
    for round_ in range(-1, rounds):  # round -1 warms up, untimed
        shift = max(round_, 0) % len(loops)
        for name in cases:
            for position, loop_name in enumerate(loops[shift:] + loops[:shift]):
                dist.barrier()
                run = LOOPS[loop_name](CASES[name], WARM_UP_STEPS if round_ < 0 else steps)
                if round_ >= 0:
                    runs.append({"round": round_, "case": name, "loop": loop_name,
                                 "position": position, **run.as_record()})
    first = dist.get_rank() == 0
    every_rank: list[Any] | None = [None] * dist.get_world_size() if first else None
    dist.gather_object([record["cpu_steps_s"] for record in runs], every_rank, dst=0)
    if every_rank is not None:
        for index, record in enumerate(runs):
            record["cpu_steps_s_by_rank"] = [ranks[index] for ranks in every_rank]
        out.write_text(json.dumps({"world_size": dist.get_world_size(), "runs": runs}))

if __name__ == "__main__":
    out, rounds, steps, loops, cases = sys.argv[1:6]
    ipycloud.run_under_torchrun(train, Path(out), int(rounds), int(steps), loops.split(","),
                                cases.split(","))
