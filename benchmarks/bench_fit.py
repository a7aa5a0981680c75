"""Benchmark: ``ipycloud.fit`` against a hand-written loop and accelerate's loop, and resume cost.

Goal: on each of three models, ``fit`` runs at least 0.97x the steps/s of a hand-written
loop doing the same work, with accelerate's loop (``Accelerator(cpu=True).prepare`` +
``accelerator.backward``) measured beside them. The models, trained on the CPU with one
thread, in fp32, from a shuffled DataLoader, with AdamW, for the same number of steps:

- ``mlp``: a small MLP on a TensorDataset of (inputs, labels);
- ``bert``: a tiny BERT classifier (``transformers.BertForSequenceClassification`` built
  from a ``BertConfig``: hidden 64, 2 layers, 2 heads, sequences of 32 tokens from a
  vocabulary of 1,000) on a map-style dataset of dicts (``input_ids``,
  ``attention_mask``, ``labels``), collated into dicts; the loss is the model's
  ``outputs.loss``;
- ``cnn``: three conv layers on 3x32x32 images of 10 classes, from a map-style dataset of
  (image, label).

The hand-written loop is ``loss.backward(); optimizer.step(); optimizer.zero_grad(
set_to_none=True)``, reading ``loss.item()`` every 10 steps as ``fit`` does. ``fit`` is
timed from the call (its setup included), the other loops from their first batch
(``Accelerator.prepare`` left out). Each round runs the three loops one after the other,
the order rotated from round to round, so that drift on a shared machine hits all alike;
each figure is the median of the rounds, the spread their minimum and maximum, and every
sample is kept in the JSON. The goal is judged on the paired ratio: the median of each
round's fit/hand-written, the two runs of a round being seconds apart, so drift between
rounds (this VM's speed swings by 10% within minutes) cancels out. 41 rounds for the MLP
and the CNN, 11 for BERT: two identical runs of the MLP or the CNN back to back differ by
up to half here, so that 11 paired ratios cannot tell 0.93 from 1.0. One untimed round
warms allocators and kernels first. Steps/s are of wall-clock time; the same ratio of
this process's CPU time is given beside it (all loops run in the one thread), as it
counts no time spent waiting for a core that another process holds.

The price of fit's own work per step (its loop, run record, preemption and interrupt
checks, progress and checkpoint scheduling: everything outside the user's model, loss and
optimizer), in microseconds: on each model, each round's fit step time less the
hand-written loop's (``fit_own_us_per_step``, median of the rounds, of wall-clock and CPU
time); and measured directly on a null workload (``fit_own_work_null_model``: a 4-to-2
linear layer with SGD on a list of tiny batches, where the user's work is small and the
difference is fit's own), fit's call (setup and end) apart from its steps. A change to
the step path shows its price there.

Resume: after a restart, a mid-epoch resume at batch 50,000 of a map-style dataset reaches
its first new step in under one second plus the checkpoint load.

Needs ``pip install accelerate`` for accelerate's loop and ``pip install transformers``
(in ``ipycloud[test]``) for the BERT model; without them those figures are left out.
Run: ``python benchmarks/bench_fit.py [--quick]`` (about 17 minutes; ``--quick``: fewer
rounds and steps, about 1 minute); results go to ``benchmarks/results/fit.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from figures import write_results
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.loop import fit

RESULTS = Path(__file__).parent / "results" / "fit.json"
THREADS = 1
QUICK_ROUNDS = 3
LOG_EVERY = 10  # steps between reads of the loss, in every loop (fit's default)
GOAL_FIT_VS_HAND_WRITTEN = 0.97
RESUME_AT_BATCH = 50_000
LOOPS = ("hand_written", "fit", "accelerate")
OWN_WORK_STEPS, OWN_WORK_ROUNDS = 2000, 11  # the null workload: steps per run, rounds


@dataclass(frozen=True)
class Case:
    """One model to train: how to build it with its data, and its loss in a plain loop."""

    name: str
    description: str
    steps: int
    batch: int
    build: Callable[[int], tuple[nn.Module, Dataset[Any]]]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    rounds: int = 11  # timed rounds (without --quick)

    def parts(self, steps: int, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer,
                                                        DataLoader[Any]]:
        """The model, AdamW and a shuffled DataLoader of ``steps`` batches, all seeded."""
        torch.manual_seed(seed)
        model, dataset = self.build(steps * self.batch)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = DataLoader(dataset, batch_size=self.batch, shuffle=True,
                            generator=torch.Generator().manual_seed(seed))
        return model, optimizer, loader


# -- the models -----------------------------------------------------------------------------


def _mlp(samples: int) -> tuple[nn.Module, Dataset[Any]]:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    return model, TensorDataset(torch.randn(samples, 64), torch.randint(0, 10, (samples,)))


class TokenDataset(Dataset[dict[str, torch.Tensor]]):
    """Padded token sequences of random lengths with a class label, one dict per sample."""

    def __init__(self, samples: int, length: int, vocabulary: int) -> None:
        self.input_ids = torch.randint(1, vocabulary, (samples, length))
        lengths = torch.randint(length // 4, length + 1, (samples, 1))
        self.attention_mask = (torch.arange(length) < lengths).long()
        self.input_ids *= self.attention_mask  # padding is token 0
        self.labels = torch.randint(0, 2, (samples,))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[index], "attention_mask": self.attention_mask[index],
                "labels": self.labels[index]}


def _bert(samples: int) -> tuple[nn.Module, Dataset[Any]]:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=256,
                        max_position_embeddings=64)  # two labels by default
    return BertForSequenceClassification(config), TokenDataset(samples, 32, 1000)


class ImageDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random 3x32x32 images with a label of 10 classes, one (image, label) per sample."""

    def __init__(self, samples: int) -> None:
        self.images = torch.randn(samples, 3, 32, 32)
        self.labels = torch.randint(0, 10, (samples,))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


def _cnn(samples: int) -> tuple[nn.Module, Dataset[Any]]:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10))
    return model, ImageDataset(samples)


def _cross_entropy(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, labels = batch
    return nn.functional.cross_entropy(model(inputs), labels)


def _own_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(**batch).loss


CASES = (
    Case("mlp", "MLP 64-256-256-10, TensorDataset", 600, 64, _mlp, _cross_entropy,
         rounds=41),  # see the module
    Case("bert", "BertForSequenceClassification, hidden 64, 2 layers, 2 heads, 32 tokens, "
                 "dict batches", 150, 32, _bert, _own_loss),
    Case("cnn", "3 conv layers (16-32-64 channels), 3x32x32 images, 10 classes, map-style "
                "dataset", 150, 32, _cnn, _cross_entropy, rounds=41),  # see the module
)


# -- the loops ------------------------------------------------------------------------------


Rates = tuple[float, float]  # steps per second of wall-clock time and of this process's CPU time


def hand_written(case: Case, steps: int) -> Rates:
    model, optimizer, loader = case.parts(steps)

    def train() -> None:
        for step, batch in enumerate(loader):
            loss = case.loss(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % LOG_EVERY == 0:
                loss.item()  # a loop that shows its loss reads it now and then, as fit does

    return _rates(steps, train)


def with_fit(case: Case, steps: int) -> Rates:
    model, optimizer, loader = case.parts(steps)
    return _rates(steps, lambda: fit(model, optimizer, loader, epochs=1, precision="fp32",
                                     device="cpu", progress=False))


def with_accelerate(case: Case, steps: int) -> Rates:
    from accelerate import Accelerator

    model, optimizer, loader = case.parts(steps)
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def train() -> None:
        for step, batch in enumerate(loader):
            loss = case.loss(model, batch)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % LOG_EVERY == 0:
                loss.item()

    return _rates(steps, train)


def _rates(steps: int, train: Callable[[], Any]) -> Rates:
    wall, cpu = time.perf_counter(), time.process_time()
    train()
    return steps / (time.perf_counter() - wall), steps / (time.process_time() - cpu)


RUNNERS: dict[str, Callable[[Case, int], Rates]] = {
    "hand_written": hand_written, "fit": with_fit, "accelerate": with_accelerate}


def measure(case: Case, loops: list[str], rounds: int, steps: int) -> dict[str, Any]:
    """Steps/s of each loop over interleaved rounds, the order rotated each round."""
    for name in loops:  # warm up allocators and kernels once
        RUNNERS[name](case, steps)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    cpu_rates: dict[str, list[float]] = {name: [] for name in loops}
    for round_ in range(rounds):
        shift = round_ % len(loops)
        for name in loops[shift:] + loops[:shift]:
            wall, cpu = RUNNERS[name](case, steps)
            rates[name].append(wall)
            cpu_rates[name].append(cpu)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    paired = [fit / hand for fit, hand in zip(rates["fit"], rates["hand_written"], strict=True)]
    cpu_medians = {name: statistics.median(values) for name, values in cpu_rates.items()}
    figures: dict[str, Any] = {
        "description": case.description, "steps_per_run": steps, "batch": case.batch,
        "rounds": rounds,
        "steps_per_s": medians,
        "spread_min_max": {name: [min(values), max(values)] for name, values in rates.items()},
        "fit_vs_hand_written": medians["fit"] / medians["hand_written"],
        "fit_vs_hand_written_paired": statistics.median(paired),
        "fit_vs_hand_written_paired_spread": [min(paired), max(paired)],
        "fit_own_us_per_step": {
            "wall": own_us_per_step(rates["fit"], rates["hand_written"]),
            "cpu": own_us_per_step(cpu_rates["fit"], cpu_rates["hand_written"])},
        "cpu_steps_per_s": cpu_medians,
        "fit_vs_hand_written_cpu": cpu_medians["fit"] / cpu_medians["hand_written"],
    }
    if "accelerate" in medians:
        figures["accelerate_vs_hand_written"] = medians["accelerate"] / medians["hand_written"]
        figures["fit_vs_accelerate"] = medians["fit"] / medians["accelerate"]
    figures["samples"] = rates
    figures["cpu_samples"] = cpu_rates
    return figures


def own_us_per_step(fit_rates: list[float], hand_rates: list[float]) -> float:
    """Microseconds a fit step takes beyond a hand-written one: the median, over paired
    rounds, of the difference of their step times (steps/s of the same round)."""
    return statistics.median(1e6 / fit - 1e6 / hand
                             for fit, hand in zip(fit_rates, hand_rates, strict=True))


def _null_parts() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _null_hand_written(batches: list[Any]) -> Rates:
    model, optimizer = _null_parts()

    def train() -> None:
        for step, (inputs, labels) in enumerate(batches):
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % LOG_EVERY == 0:
                loss.item()

    return _rates(len(batches), train)


def _null_fit(batches: list[Any]) -> Rates:
    model, optimizer = _null_parts()
    return _rates(len(batches), lambda: fit(model, optimizer, batches, epochs=1,
                                            precision="fp32", device="cpu", progress=False))


def own_work(steps: int, rounds: int) -> dict[str, Any]:
    """fit's own work on the null workload: per step (runs of ``steps`` steps less the
    call's cost), and per call (runs of one step), of wall-clock and CPU time; paired,
    interleaved rounds, the order alternated."""
    torch.manual_seed(1)
    batches = [(torch.randn(2, 4), torch.randint(0, 2, (2,))) for _ in range(steps)]
    loops = {"hand_written": _null_hand_written, "fit": _null_fit}
    for run in loops.values():  # warm up
        run(batches)
    long: dict[str, list[Rates]] = {name: [] for name in loops}
    short: dict[str, list[Rates]] = {name: [] for name in loops}
    for round_ in range(rounds):
        for name in (list(loops) if round_ % 2 == 0 else list(reversed(loops))):
            long[name].append(loops[name](batches))
            short[name].append(loops[name](batches[:1]))
    figures: dict[str, Any] = {"steps_per_run": steps, "rounds": rounds}
    for index, clock in enumerate(("wall", "cpu")):
        call_us = own_us_per_step([rates[index] for rates in short["fit"]],
                                  [rates[index] for rates in short["hand_written"]])
        run_us = own_us_per_step([rates[index] for rates in long["fit"]],
                                 [rates[index] for rates in long["hand_written"]])
        figures[clock] = {"us_per_step": run_us - call_us / steps, "call_ms": call_us / 1e3,
                          "hand_written_us_per_step": statistics.median(
                              1e6 / rates[index] for rates in long["hand_written"])}
    figures["samples"] = {"steps": long, "one_step": short}
    return figures


def own_calls_per_step(case: Case, steps: int) -> dict[str, float]:
    """Python function calls per step, counted (cProfile), not timed, so this VM's speed
    swings cannot move them: those of fit's own code (ipycloud's functions), and all of
    fit's against all of the hand-written loop's, from runs of ``steps`` and ``steps // 5``
    steps (the difference leaves each call's start and end out)."""
    import cProfile
    import pstats

    def calls(run: Callable[[Case, int], Rates], count: int) -> tuple[int, int]:
        profiler = cProfile.Profile()
        profiler.runcall(run, case, count)
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        return (sum(figures[1] for figures in stats.values()),
                sum(figures[1] for where, figures in stats.items() if "ipycloud" in where[0]))

    short = steps // 5
    with_fit(case, short)  # what a first call imports is no step's
    fit_short, fit_long = calls(with_fit, short), calls(with_fit, steps)
    hand_short, hand_long = calls(hand_written, short), calls(hand_written, steps)
    per_step = steps - short
    return {"ipycloud": (fit_long[1] - fit_short[1]) / per_step,
            "fit_all": (fit_long[0] - fit_short[0]) / per_step,
            "hand_written_all": (hand_long[0] - hand_short[0]) / per_step}


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

        class FirstStep(Callback):
            at: float | None = None

            def on_step(self, step: int, logs: dict[str, Any]) -> None:
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


def _available(package: str, why: str) -> bool:
    if importlib.util.find_spec(package) is not None:
        return True
    print(f"{package} is not installed, so {why} is left out: pip install {package}")
    return False


def _versions(*packages: str) -> dict[str, str | None]:
    found = {package: importlib.util.find_spec(package) for package in packages}
    return {package: importlib.metadata.version(package) if spec else None
            for package, spec in found.items()}


def _table(models: dict[str, dict[str, Any]]) -> list[str]:
    ratios = (("fit/hand", "fit_vs_hand_written"), ("paired", "fit_vs_hand_written_paired"),
              ("fit/acc", "fit_vs_accelerate"),
              ("acc/hand", "accelerate_vs_hand_written"),
              ("fit/hand cpu", "fit_vs_hand_written_cpu"))
    lines = ["steps/s, median of the interleaved rounds [min-max]; ratios of the medians, "
             "and 'paired': the median of each round's fit/hand; goal: paired fit/hand >= "
             f"{GOAL_FIT_VS_HAND_WRITTEN}",
             f"{'model':<6}{'rounds':>7}"
             + "".join(f"{name.replace('_', '-'):>22}" for name in LOOPS)
             + "".join(f"{title:>13}" for title, _ in ratios)]
    for name, figures in models.items():
        line = f"{name:<6}"
        line += f"{figures['rounds']:>7}"
        for loop in LOOPS:
            if loop not in figures["steps_per_s"]:
                line += f"{'-':>22}"
                continue
            low, high = figures["spread_min_max"][loop]
            line += f"{figures['steps_per_s'][loop]:.1f} [{low:.1f}-{high:.1f}]".rjust(22)
        line += "".join(f"{figures[key]:>13.3f}" if key in figures else f"{'-':>13}"
                        for _, key in ratios)
        met = figures["fit_vs_hand_written_paired"] >= GOAL_FIT_VS_HAND_WRITTEN
        lines.append(line + ("  met" if met else "  MISSED"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_ROUNDS} rounds of half as many steps")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]  # other processes' load: the figures' conditions
    torch.set_num_threads(THREADS)
    loops = ["hand_written", "fit"]
    if _available("accelerate", "accelerate's loop"):
        loops.append("accelerate")
    cases = [case for case in CASES
             if case.name != "bert" or _available("transformers", "the BERT model")]
    models = {}
    for case in cases:
        steps = case.steps // 2 if args.quick else case.steps
        models[case.name] = measure(case, loops, QUICK_ROUNDS if args.quick else case.rounds,
                                    steps)
        models[case.name]["python_calls_per_step"] = own_calls_per_step(case, steps)
        print(f"{case.name}: done", flush=True)
    own = own_work(OWN_WORK_STEPS // 2 if args.quick else OWN_WORK_STEPS,
                   QUICK_ROUNDS if args.quick else OWN_WORK_ROUNDS)
    resume = resume_cost()
    results = {
        "machine": {"torch": torch.__version__, "threads": THREADS, "quick": args.quick,
                    **_versions("accelerate", "transformers"),
                    "cores": os.cpu_count(), "load_average_1min_at_start": round(load_at_start, 2),
                    "load_average_1min_at_end": round(os.getloadavg()[0], 2)},
        "goal_fit_vs_hand_written": GOAL_FIT_VS_HAND_WRITTEN,
        "models": models,
        "fit_own_work_null_model": own,
        "resume_at_batch_50000": resume,
        "goal_resume_beyond_load_s": 1.0,
    }
    write_results(RESULTS, results)
    print("\n".join(_table(models)))
    print("fit's own work, us per step beyond the hand-written loop (median of paired rounds, "
          "wall / cpu): " + ", ".join(
              f"{name} {figures['fit_own_us_per_step']['wall']:.1f} / "
              f"{figures['fit_own_us_per_step']['cpu']:.1f}" for name, figures in models.items())
          + f"; null workload {own['wall']['us_per_step']:.1f} / {own['cpu']['us_per_step']:.1f}"
          f" per step, plus {own['wall']['call_ms']:.2f} / {own['cpu']['call_ms']:.2f} ms a call")
    print("Python calls per step (counted): " + ", ".join(
        f"{name} fit {figures['python_calls_per_step']['fit_all']:.0f} (ipycloud's "
        f"{figures['python_calls_per_step']['ipycloud']:.0f}), hand-written "
        f"{figures['python_calls_per_step']['hand_written_all']:.0f}"
        for name, figures in models.items()))
    print(f"resume at batch {RESUME_AT_BATCH}: first new step after "
          f"{resume['to_first_new_step_s']:.3f} s, of which checkpoint load "
          f"{resume['checkpoint_load_s']:.3f} s (goal: under 1 s beyond the load)")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
