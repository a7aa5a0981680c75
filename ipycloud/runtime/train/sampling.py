"""Reproducible data for ``fit``: each epoch's order and each sample's random draws from a seed.

An epoch's order is a function of ``(seed, epoch)``; the random draws a dataset makes
while loading sample ``index`` (random crops, flips, noise) are a function of ``(seed,
epoch, index)``. Neither depends on how many batches came before, on the number of
DataLoader workers, or on the number of processes, so a run resumed mid-epoch sees the
same samples with the same augmentation as the run that was interrupted.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

Key = tuple[int, int]  # (epoch, dataset index): what the seeded dataset is asked for

_MASK_64 = (1 << 64) - 1


def mixed_seed(*parts: int) -> int:
    """A well-spread 63-bit seed from integers (SplitMix64 over each part in turn)."""
    state = 0x9E3779B97F4A7C15
    for part in parts:
        state = (state ^ (part & _MASK_64)) * 0xBF58476D1CE4E5B9 & _MASK_64
        state = (state ^ (state >> 27)) * 0x94D049BB133111EB & _MASK_64
        state ^= state >> 31
    return state >> 1


class EpochSampler:
    """The keys of one epoch for one rank, from a global position on.

    ``order(epoch)`` gives the epoch's units in global order: dataset indices, or lists of
    them for a batch sampler. Like torch's DistributedSampler, the order is padded to a
    multiple of the world size and dealt out round-robin; ``consumed`` units of the
    padded order (by all ranks together) are skipped, so a run may resume under a
    different number of processes and still continue exactly where the data stopped.
    """

    def __init__(self, order: Callable[[int], list[Any]], rank: int = 0, world_size: int = 1,
                 *, batched: bool = False, keyed: bool = True) -> None:
        self.order, self.rank, self.world_size = order, rank, world_size
        self.batched, self.keyed = batched, keyed  # keyed: (epoch, index) for SeededDataset
        self.epoch = 0
        self.consumed = 0

    def set_position(self, epoch: int, consumed: int) -> None:
        self.epoch, self.consumed = epoch, consumed

    def units(self) -> int:
        """Units in the whole padded epoch, all ranks together."""
        return _padded(len(self.order(self.epoch)), self.world_size)

    def _mine(self) -> list[Any]:
        order = self.order(self.epoch)
        order = order + order[:_padded(len(order), self.world_size) - len(order)]
        return order[self.consumed + self.rank::self.world_size]

    def __iter__(self) -> Iterator[Any]:
        if not self.keyed:
            return iter(self._mine())
        epoch = self.epoch
        if self.batched:
            return ([(epoch, index) for index in unit] for unit in self._mine())
        return ((epoch, index) for index in self._mine())

    def __len__(self) -> int:
        return len(self._mine())


class SeededDataset:
    """A map-style dataset whose item ``(epoch, index)`` is loaded under seeded generators.

    Python's ``random``, NumPy's global generator (when NumPy is imported) and torch's
    default generator are seeded from ``(seed, epoch, index)`` before each item is loaded;
    in the training process
    their states are put back after each batch, so the model's own draws (dropout) do
    not depend on the data.
    """

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Key) -> Any:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[Key]) -> list[Any]:
        import torch

        with _generators_kept(in_worker=torch.utils.data.get_worker_info() is not None):
            items = []
            for epoch, index in keys:
                _seed_generators(mixed_seed(self.seed, epoch, index))
                items.append(self.dataset[index])
            return items


@contextlib.contextmanager
def _generators_kept(in_worker: bool) -> Iterator[None]:
    """Put the global generators back afterwards; a worker process needs no restoring."""
    if in_worker:
        yield
        return
    import torch

    numpy = sys.modules.get("numpy")
    states = (random.getstate(), torch.get_rng_state(),
              numpy.random.get_state() if numpy is not None else None)
    try:
        yield
    finally:
        random.setstate(states[0])
        torch.set_rng_state(states[1])
        if numpy is not None:
            numpy.random.set_state(states[2])


def _seed_generators(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.default_generator.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed & 0xFFFFFFFF)


def draws_nothing(dataset: Any) -> bool:
    """Whether loading an item draws no random numbers: a TensorDataset (tensors in memory)."""
    from torch.utils.data import TensorDataset

    return isinstance(dataset, TensorDataset)


def shuffled_order(length: int, shuffle: bool, seed: int) -> Callable[[int], list[int]]:
    """The order of a plain DataLoader: ``randperm`` seeded with ``seed + epoch``, or 0..n-1."""
    def order(epoch: int) -> list[int]:
        import torch

        if not shuffle:
            return list(range(length))
        generator = torch.Generator().manual_seed(seed + epoch)
        return torch.randperm(length, generator=generator).tolist()

    return order


def sampler_order(sampler: Any, seed: int) -> Callable[[int], list[Any]]:
    """The order a custom (batch) sampler gives when its generators are seeded for the epoch.

    Torch's default generator, Python's ``random`` and the sampler's own ``generator`` are
    seeded from ``(seed, epoch)`` while the sampler is read, and put back afterwards. The
    order is kept for the epoch being read, so it is computed once per epoch.
    """
    cached: dict[int, list[Any]] = {}

    def order(epoch: int) -> list[Any]:
        if epoch not in cached:
            cached.clear()
            cached[epoch] = read_seeded(sampler, mixed_seed(seed, epoch))
        return cached[epoch]

    return order


def read_seeded(sampler: Any, seed: int) -> list[Any]:
    """Everything ``sampler`` yields, read with its generators seeded from ``seed``."""
    import torch

    own: Any = getattr(sampler, "generator", None)
    own_state = own.get_state() if isinstance(own, torch.Generator) else None
    with _generators_kept(in_worker=False):
        _seed_generators(seed)
        if own_state is not None:
            own.manual_seed(seed)
        try:
            return list(sampler)
        finally:
            if own_state is not None:
                own.set_state(own_state)


def _padded(length: int, world_size: int) -> int:
    return math.ceil(length / world_size) * world_size
