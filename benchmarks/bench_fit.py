"""Benchmark: ``ipycloud.fit`` against a hand-written loop and accelerate's loop, and resume cost.

Goals: ``fit`` runs at least 0.97x the steps/s of a hand-written loop doing the same work
(a small MLP on the CPU, fp32, a shuffled DataLoader, AdamW), and beats accelerate's loop
(``Accelerator.prepare`` + ``accelerator.backward``). Resume: after a restart, a mid-epoch
resume at batch 50,000 of a map-style dataset reaches its first new step in under one
second plus the checkpoint load. Needs ``pip install accelerate`` for the second figure.
Run: ``python benchmarks/bench_fit.py``; results go to ``benchmarks/results/fit.json``.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.train.loop import fit

RESULTS = Path(__file__).parent / "results" / "fit.json"
STEPS = 600
ROUNDS = 5
BATCH = 64
RESUME_AT_BATCH = 50_000


def parts(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(BATCH * STEPS, 64, generator=generator)
    labels = torch.randint(0, 10, (BATCH * STEPS,), generator=generator)
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    return model, optimizer, loader


def hand_written() -> float:
    model, optimizer, loader = parts()
    started = time.perf_counter()
    for step, (inputs, labels) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            loss.item()  # a loop that shows its loss reads it now and then, as fit does
    return STEPS / (time.perf_counter() - started)


def with_fit() -> float:
    model, optimizer, loader = parts()
    started = time.perf_counter()
    fit(model, optimizer, loader, epochs=1, precision="fp32", device="cpu", progress=False)
    return STEPS / (time.perf_counter() - started)


def with_accelerate() -> float:
    from accelerate import Accelerator

    model, optimizer, loader = parts()
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    started = time.perf_counter()
    for step, (inputs, labels) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(inputs), labels)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            loss.item()
    return STEPS / (time.perf_counter() - started)


def resume_cost() -> dict[str, float]:
    """Seconds from calling fit to its first new step, resuming at batch 50,000."""
    samples = (RESUME_AT_BATCH + 1000) * 8
    dataset = TensorDataset(torch.randn(samples, 16), torch.randint(0, 4, (samples,)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tempfile.TemporaryDirectory() as folder:
        manager = CheckpointManager(folder)
        manager.save({"model": model, "optimizer": optimizer, "history": {}}, RESUME_AT_BATCH,
                     epoch=0, data_position={"epoch": 0, "batch": RESUME_AT_BATCH, "seed": 0})
        load_s = _timed(lambda: manager.load({"model": model, "optimizer": optimizer,
                                               "history": {}}))

        class FirstStep:
            at: float | None = None

            def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
                FirstStep.at = FirstStep.at or time.perf_counter()

        started = time.perf_counter()
        fit(model, optimizer, DataLoader(dataset, batch_size=8, shuffle=True),
            max_steps=RESUME_AT_BATCH + 1, precision="fp32", device="cpu", progress=False,
            checkpoint=folder, callbacks=[FirstStep()])
        assert FirstStep.at is not None
    to_first_step = FirstStep.at - started
    return {"checkpoint_load_s": load_s, "to_first_new_step_s": to_first_step,
            "beyond_checkpoint_load_s": to_first_step - load_s}


def _timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    torch.set_num_threads(1)
    rates: dict[str, list[float]] = {"hand_written": [], "fit": [], "accelerate": []}
    runners = {"hand_written": hand_written, "fit": with_fit, "accelerate": with_accelerate}
    with_fit()  # warm up allocators and kernels once
    for _ in range(ROUNDS):
        for name, runner in runners.items():  # interleaved, so drift hits all alike
            rates[name].append(runner())
    medians = {name: statistics.median(values) for name, values in rates.items()}
    resume = resume_cost()
    results = {
        "machine": {"torch": torch.__version__, "threads": 1, "steps_per_run": STEPS,
                    "batch": BATCH, "rounds": ROUNDS},
        "steps_per_s": medians,
        "fit_vs_hand_written": medians["fit"] / medians["hand_written"],
        "accelerate_vs_hand_written": medians["accelerate"] / medians["hand_written"],
        "fit_vs_accelerate": medians["fit"] / medians["accelerate"],
        "goal_fit_vs_hand_written": 0.97,
        "resume_at_batch_50000": resume,
        "goal_resume_beyond_load_s": 1.0,
        "samples": rates,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"steps/s (median of {ROUNDS}): hand-written {medians['hand_written']:.0f}, "
          f"fit {medians['fit']:.0f}, accelerate {medians['accelerate']:.0f}")
    print(f"fit / hand-written = {results['fit_vs_hand_written']:.3f} (goal >= 0.97); "
          f"accelerate / hand-written = {results['accelerate_vs_hand_written']:.3f}; "
          f"fit / accelerate = {results['fit_vs_accelerate']:.3f}")
    print(f"resume at batch {RESUME_AT_BATCH}: first new step after "
          f"{resume['to_first_new_step_s']:.3f} s, of which checkpoint load "
          f"{resume['checkpoint_load_s']:.3f} s (goal: under 1 s beyond the load)")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
