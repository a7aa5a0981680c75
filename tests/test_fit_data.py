"""``fit`` resumes its data exactly: augmentation in workers, custom samplers, other world sizes."""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from checkpoint_helpers import differences, in_child
from process_helpers import ended
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, WeightedRandomSampler
from waiting import wait_for

from ipycloud.runtime.train.data import EpochData
from ipycloud.runtime.train.distributed import launch
from ipycloud.runtime.train.loop import fit

SAMPLES, BATCH = 96, 8  # 12 batches an epoch


class Augmented(Dataset):
    """Each item drawn through Python's random, NumPy's global generator and torch's."""

    def __init__(self, samples: int = SAMPLES) -> None:
        generator = torch.Generator().manual_seed(5)
        self.inputs = torch.randn(samples, 6, generator=generator)
        self.labels = self.inputs[:, :3].argmax(dim=1)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        flip = -1.0 if random.random() < 0.5 else 1.0
        noise = torch.randn(6) * 0.1 + float(np.random.standard_normal()) * 0.01
        return self.inputs[index] * flip + noise, self.labels[index]


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train(data: Any, checkpoint: Path, max_steps: int) -> dict[str, Any]:
    model, optimizer = model_and_optimizer()
    fit(model, optimizer, data, max_steps=max_steps, precision="fp32", device="cpu",
        progress=False, checkpoint=checkpoint, checkpoint_every="1h", seed=11)
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def interrupted_and_resumed(make_data: Any, tmp_path: Path, stop_at: int,
                            total: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(an uninterrupted run, a run stopped at ``stop_at`` and resumed in a new fit call)."""
    whole = train(make_data(first=True), tmp_path / "whole", total)
    train(make_data(first=True), tmp_path / "parts", stop_at)
    return whole, train(make_data(first=False), tmp_path / "parts", total)


@pytest.mark.parametrize(("first_workers", "resumed_workers"), [(2, 2), (2, 0)])
def test_random_augmentation_in_workers_resumes_bit_for_bit(
        tmp_path: Path, first_workers: int, resumed_workers: int) -> None:
    def make_data(first: bool) -> DataLoader:
        workers = first_workers if first else resumed_workers
        return DataLoader(Augmented(), batch_size=BATCH, shuffle=True, num_workers=workers)

    whole, resumed = interrupted_and_resumed(make_data, tmp_path, stop_at=7, total=20)
    assert differences(resumed, whole) == []


def test_the_draws_of_a_sample_do_not_depend_on_what_came_before() -> None:
    data = EpochData(DataLoader(Augmented(), batch_size=4, shuffle=True), seed=3)
    data.epoch = 1
    whole = list(data.epoch_batches())
    data.consumed(5)  # as a run resumed at the sixth batch of the epoch sees it
    rest = list(data.epoch_batches())
    assert len(rest) == len(whole) - 5
    for resumed, original in zip(rest, whole[5:], strict=True):
        assert torch.equal(resumed[0], original[0])


def test_loading_data_leaves_the_training_generators_alone() -> None:
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    list(EpochData(DataLoader(Augmented(16), batch_size=4), seed=3).epoch_batches())
    assert torch.equal(torch.rand(3), expected)  # dropout draws as if no data were loaded


GLOBAL_DRAWS: dict[str, Callable[[], float]] = {
    "random": random.random, "numpy": lambda: float(np.random.random()),
    "torch": lambda: float(torch.rand(()))}


class DrawsLate(Dataset):
    """Items 0..n-1 that draw from one global generator, from item ``first_drawing`` on."""

    def __init__(self, generator: str, first_drawing: int) -> None:
        self.draw, self.first_drawing = GLOBAL_DRAWS[generator], first_drawing

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        drawn = self.draw() if index >= self.first_drawing else 0.0
        return torch.tensor([index + drawn], dtype=torch.float64)


def global_draws() -> list[float]:
    return [draw() for draw in GLOBAL_DRAWS.values()]


@pytest.mark.parametrize("generator", list(GLOBAL_DRAWS))
def test_a_generator_first_drawn_from_late_is_seeded_like_the_others(generator: str) -> None:
    def load(global_seed: int, skipped_batches: int) -> tuple[torch.Tensor, list[float]]:
        """Items 10.. of an epoch in batches of 4, and the global draws right after."""
        for seed in (random.seed, np.random.seed, torch.manual_seed):
            seed(global_seed)
        data = EpochData(DataLoader(DrawsLate(generator, first_drawing=10), batch_size=4),
                         seed=3)
        data.consumed(skipped_batches)
        items = torch.cat(list(data.epoch_batches()))[10 - 4 * skipped_batches:, 0]
        return items, global_draws()

    whole, after_whole = load(global_seed=1, skipped_batches=0)
    resumed, _ = load(global_seed=2, skipped_batches=2)  # first drawn from in its first batch
    assert torch.equal(resumed, whole)  # a function of (seed, epoch, index) alone
    assert not torch.equal(whole, torch.arange(10, 24, dtype=torch.float64))  # it drew
    for seed in (random.seed, np.random.seed, torch.manual_seed):
        seed(1)
    assert after_whole == global_draws()  # the training process's generators were put back


def weighted(generator: bool) -> DataLoader:
    weights = torch.linspace(0.1, 1.0, SAMPLES)
    sampler = WeightedRandomSampler(weights, num_samples=SAMPLES, replacement=True,
                                    generator=torch.Generator() if generator else None)
    return DataLoader(Augmented(), batch_size=BATCH, sampler=sampler)


@pytest.mark.parametrize("own_generator", [True, False])
def test_a_weighted_random_sampler_resumes_bit_for_bit(tmp_path: Path,
                                                      own_generator: bool) -> None:
    whole, resumed = interrupted_and_resumed(
        lambda first: weighted(own_generator), tmp_path, stop_at=5, total=18)
    assert differences(resumed, whole) == []


class BucketBatches(Sampler[list[int]]):
    """A custom batch sampler: shuffled buckets of neighbouring indices."""

    def __len__(self) -> int:
        return SAMPLES // BATCH

    def __iter__(self) -> Any:
        for bucket in torch.randperm(SAMPLES // BATCH).tolist():
            yield list(range(bucket * BATCH, (bucket + 1) * BATCH))


def test_a_custom_batch_sampler_resumes_bit_for_bit(tmp_path: Path) -> None:
    whole, resumed = interrupted_and_resumed(
        lambda first: DataLoader(Augmented(), batch_sampler=BucketBatches()), tmp_path,
        stop_at=5, total=16)
    assert differences(resumed, whole) == []


class Unseeded(Sampler[int]):
    """Draws from a generator of its own that no seed reaches."""

    def __len__(self) -> int:
        return SAMPLES

    def __iter__(self) -> Any:
        return iter(np.random.default_rng().permutation(SAMPLES).tolist())


def test_a_sampler_that_no_seed_reaches_is_refused(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(ValueError, match="the sampler Unseeded gives a different order each "
                                         "time from the same seed"):
        fit(model, optimizer, DataLoader(Augmented(), batch_size=BATCH, sampler=Unseeded()),
            max_steps=2, device="cpu", progress=False, checkpoint=tmp_path)


def test_the_position_carries_over_to_another_number_of_processes() -> None:
    def loader() -> DataLoader:
        return DataLoader(list(range(40)), batch_size=4, shuffle=True)

    ranks = [EpochData(loader(), seed=2, rank=rank, world_size=2) for rank in range(2)]
    seen = []
    for data in ranks:  # each rank consumes 3 batches: 24 samples in all
        batches = data.epoch_batches()
        seen += [int(item) for _ in range(3) for item in next(batches)]
        data.consumed(3)
    alone = EpochData(loader(), seed=2)
    alone.resume(ranks[0].position())
    rest = [int(item) for batch in alone.epoch_batches() for item in batch]
    assert sorted(seen + rest) == list(range(40))  # nothing skipped, nothing twice
    four = [EpochData(loader(), seed=2, rank=rank, world_size=4) for rank in range(4)]
    for data in four:
        data.resume(ranks[1].position())
    spread = [int(item) for data in four for batch in data.epoch_batches() for item in batch]
    assert sorted(seen + spread) == list(range(40))


def test_data_that_cannot_be_split_again_refuses_another_number_of_processes() -> None:
    saved = EpochData([[1], [2], [3], [4]], seed=0, rank=0, world_size=2)
    saved.consumed(1)
    with pytest.raises(ValueError, match="written by 2 process"):
        EpochData([[1], [2], [3], [4]], seed=0).resume(saved.position())


class Recording(Dataset):
    """Appends each index it loads to a file, from whichever process loads it."""

    def __init__(self, record: Path) -> None:
        self.record = record
        generator = torch.Generator().manual_seed(1)
        self.inputs = torch.randn(48, 6, generator=generator)

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with open(self.record, "a") as file:
            file.write(f"{index}\n")
        return self.inputs[index], self.inputs[index, :3].argmax()


def _train_in_rank(folder: str, record: str) -> None:
    model, optimizer = model_and_optimizer()
    fit(model, optimizer, DataLoader(Recording(Path(record)), batch_size=4, shuffle=True),
        max_steps=3, device="cpu", progress=False, checkpoint=folder, seed=4)


def test_a_checkpoint_from_two_processes_resumes_in_one_without_skipping(
        tmp_path: Path) -> None:
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    launch(_train_in_rank, str(tmp_path / "ckpt"), str(first), nprocs=2)
    model, optimizer = model_and_optimizer()
    fit(model, optimizer, DataLoader(Recording(second), batch_size=4, shuffle=True), epochs=1,
        device="cpu", progress=False, checkpoint=tmp_path / "ckpt")
    before = [int(line) for line in first.read_text().split()]
    after = [int(line) for line in second.read_text().split()]
    assert len(before) == 24 and sorted(before + after) == list(range(48))


KERNEL_TRAINING = """
import os, sys, time
from pathlib import Path
import torch
from torch.utils.data import DataLoader, TensorDataset
from ipycloud.runtime.train.loop import fit

def slow_start(worker_id):  # as a worker importing a large library takes a while
    Path(sys.argv[1], f"worker-{worker_id}.pid").write_text(str(os.getpid()))
    time.sleep(2)

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
model = torch.nn.Linear(4, 2)
loader = DataLoader(data, batch_size=8, num_workers=2, worker_init_fn=slow_start)
fit(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, device="cpu", progress=False)
"""


def test_workers_end_with_a_kernel_killed_while_they_start(tmp_path: Path) -> None:
    """torch's workers watch the parent they find once started: one whose kernel dies
    while it starts would watch its new parent (init) and never end."""
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL_TRAINING, str(tmp_path)])
    pid_files = [tmp_path / "worker-0.pid", tmp_path / "worker-1.pid"]
    try:
        wait_for(lambda: all(path.exists() and path.read_text() for path in pid_files),
                 timeout=60, what="both workers starting")
        workers = [psutil.Process(int(path.read_text())) for path in pid_files]
    finally:
        kernel.kill()
        kernel.wait()
    try:
        wait_for(lambda: all(ended(worker) for worker in workers), timeout=15,
                 what="the workers ended with their kernel")
    finally:
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.kill()


def _train_with_workers_started_by(start_method: str) -> list[int]:
    loader = DataLoader(Augmented(), batch_size=BATCH, shuffle=True, num_workers=2,
                        multiprocessing_context=start_method)
    model, optimizer = model_and_optimizer()
    history = fit(model, optimizer, loader, max_steps=3, device="cpu", progress=False,
                  seed=11)
    return [row["step"] for row in history.steps]


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_workers_started_by_spawn_or_a_forkserver_train(start_method: str) -> None:
    """A forkserver, not the trainer, is its workers' parent: they must not take that for
    their trainer's death. (In a child: the forkserver lives as long as its process.)"""
    assert in_child(_train_with_workers_started_by, start_method) == [3]
