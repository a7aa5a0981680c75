"""Reproducible data for ``fit``: each epoch's order and each sample's random draws from a seed.

An epoch's order is a function of ``(seed, epoch)``; the random draws a dataset makes
while loading sample ``index`` (random crops, flips, noise) are a function of ``(seed,
epoch, index)``. Neither depends on how many batches came before, on the number of
DataLoader workers, or on the number of processes, so a run resumed mid-epoch sees the
same samples with the same augmentation as the run that was interrupted.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

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

    Before each item is loaded, every process-wide generator the dataset draws from
    (Python's ``random``, NumPy's global generator, torch's default generator) is seeded
    from ``(seed, epoch, index)``. Which ones it draws from is learnt as it loads: a
    generator's state is compared before and after each batch, and a batch that drew from
    a generator not seeded yet is loaded again with it seeded. So a dataset that draws
    nothing costs no seeding, and every item is still a function of ``(seed, epoch,
    index)``. In the training process the states are put back after each batch, so the
    model's own draws (dropout) do not depend on the data.
    """

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        self.drawn_from: set[str] = set()  # names of the generators loading draws from

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Key) -> Any:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[Key]) -> list[Any]:
        import torch

        in_worker = torch.utils.data.get_worker_info() is not None
        while True:
            generators = _global_generators()
            watched = [generator for generator in generators
                       if generator.name not in self.drawn_from]
            # A worker's generators are its own: only the training process puts them back.
            kept = [] if in_worker else [generator for generator in generators
                                         if generator.name in self.drawn_from]
            marks = [generator.mark() for generator in watched]
            states = [generator.get_state() for generator in kept]
            items = self._load(keys, generators)
            for generator, state in zip(kept, states, strict=True):
                generator.set_state(state)
            newly_drawn = [(generator, mark) for generator, mark in zip(watched, marks,
                                                                        strict=True)
                           if generator.mark().key != mark.key]
            if not newly_drawn and len(_global_generators()) == len(generators):
                return items
            for generator, mark in newly_drawn:  # as before the batch, then loaded again
                if not in_worker:
                    generator.set_state(mark.state)
                self.drawn_from.add(generator.name)

    def _load(self, keys: Sequence[Key], generators: list[_GlobalGenerator]) -> list[Any]:
        seeded = [generator for generator in generators if generator.name in self.drawn_from]
        items = []
        for epoch, index in keys:
            if seeded:
                seed = mixed_seed(self.seed, epoch, index)
                for generator in seeded:
                    generator.seed(seed)
            items.append(self.dataset[index])
        return items


class _Mark(NamedTuple):
    """A generator as read before a batch: ``key`` changes with every draw, ``state``
    puts the generator back."""

    key: Any
    state: Any


class _GlobalGenerator(NamedTuple):
    """A process-wide random generator: how to read, restore, seed and watch its state."""

    name: str
    get_state: Callable[[], Any]
    set_state: Callable[[Any], Any]
    seed: Callable[[int], Any]
    mark: Callable[[], _Mark]


def _global_generators() -> list[_GlobalGenerator]:
    """Python's and torch's generators, and NumPy's where NumPy is imported."""
    import torch

    generators = [
        _GlobalGenerator("random", random.getstate, random.setstate, random.seed,
                         _python_mark),
        _GlobalGenerator("torch", torch.get_rng_state, torch.set_rng_state,
                         torch.default_generator.manual_seed, _torch_mark)]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        generators.append(_GlobalGenerator(
            "numpy", numpy.random.get_state, numpy.random.set_state,
            lambda seed: numpy.random.seed(seed & 0xFFFFFFFF), _numpy_watch(numpy).mark))
    return generators


def _python_mark() -> _Mark:
    state = random.getstate()
    return _Mark(state, state)


def _torch_mark() -> _Mark:
    import torch

    state = torch.get_rng_state()
    return _Mark(state.numpy().tobytes(), state)


class _NumpyWatch:
    """NumPy's legacy global generator, watched through the words of its MT19937 state.

    Copying the 2,500 bytes of words and position takes well under a microsecond; the full
    state (``get_state``) takes about 30, so it is read only when the words changed. Not
    in the words: the one Gaussian NumPy's legacy normal draws keep for the next call. A
    dataset whose only NumPy draw in a batch takes a Gaussian the training code left
    there, or a kept state whose Gaussian the training code used since, can escape the
    watch; neither happens unless the training process itself draws from NumPy's legacy
    global normal distribution.
    """

    _WORDS = 624 * 4 + 4  # uint32 key[624]; int pos (numpy/random/src/mt19937/mt19937.h)

    def __init__(self, numpy: Any) -> None:
        self._numpy = numpy
        try:
            generator = numpy.random.mtrand._rand._bit_generator
            self._address: int | None = (generator.ctypes.state_address
                                         if type(generator).__name__ == "MT19937" else None)
        except AttributeError:
            self._address = None
        self._last: _Mark | None = None

    def mark(self) -> _Mark:
        if self._address is None:
            state = self._numpy.random.get_state()
            return _Mark(_numpy_state_key(state), state)
        words = ctypes.string_at(self._address, self._WORDS)
        if self._last is None or self._last.key != words:
            self._last = _Mark(words, self._numpy.random.get_state())
        return self._last


def _numpy_state_key(state: tuple[Any, ...]) -> tuple[Any, ...]:
    """A legacy NumPy state (name, key array, position, Gaussian cache) as a comparable value."""
    return (state[1].tobytes(), *state[2:])


@functools.cache
def _numpy_watch(numpy: Any) -> _NumpyWatch:
    """The one watch of NumPy's global generator in this process."""
    return _NumpyWatch(numpy)


@contextlib.contextmanager
def _generators_kept() -> Iterator[list[_GlobalGenerator]]:
    """The global generators, put back as they were afterwards."""
    generators = _global_generators()
    states = [generator.get_state() for generator in generators]
    try:
        yield generators
    finally:
        for generator, state in zip(generators, states, strict=True):
            generator.set_state(state)


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

    return _last_epoch_kept(order)


def sampler_order(sampler: Any, seed: int) -> Callable[[int], list[Any]]:
    """The order a custom (batch) sampler gives when its generators are seeded for the epoch.

    Torch's default generator, Python's ``random`` and the sampler's own ``generator`` are
    seeded from ``(seed, epoch)`` while the sampler is read, and put back afterwards.
    """
    return _last_epoch_kept(lambda epoch: read_seeded(sampler, mixed_seed(seed, epoch)))


def _last_epoch_kept(order: Callable[[int], list[Any]]) -> Callable[[int], list[Any]]:
    """``order``, computed once for the epoch asked for last."""
    kept: dict[int, list[Any]] = {}

    def cached(epoch: int) -> list[Any]:
        if epoch not in kept:
            kept.clear()
            kept[epoch] = order(epoch)
        return kept[epoch]

    return cached


def read_seeded(sampler: Any, seed: int) -> list[Any]:
    """Everything ``sampler`` yields, read with its generators seeded from ``seed``."""
    import torch

    own: Any = getattr(sampler, "generator", None)
    own_state = own.get_state() if isinstance(own, torch.Generator) else None
    with _generators_kept() as generators:
        for generator in generators:
            generator.seed(seed)
        if own_state is not None:
            own.manual_seed(seed)
        try:
            return list(sampler)
        finally:
            if own_state is not None:
                own.set_state(own_state)


def _padded(length: int, world_size: int) -> int:
    return math.ceil(length / world_size) * world_size
