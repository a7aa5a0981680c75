"""Training data for ``fit``, epoch by epoch, able to start part-way into an epoch.

A DataLoader over a map-style dataset is rebuilt around an ``EpochSampler`` and a
``SeededDataset`` (see ``sampling``): the epoch's order and every sample's random draws
follow from the seed, and the batches already consumed are skipped by index, without
loading them, under any number of processes. Other iterables are read from the start
and the consumed batches discarded, under the number of processes that consumed them.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ipycloud.runtime.train.interrupt import WorkerInit
from ipycloud.runtime.train.sampling import (
    EpochSampler,
    SeededDataset,
    draws_nothing,
    read_seeded,
    sampler_order,
    shuffled_order,
)
from ipycloud.runtime.train.workers import LoaderIterators
from ipycloud.runtime.units import counted
from ipycloud.runtime.user_warning import warn

_LOADER_SETTINGS = ("num_workers", "collate_fn", "pin_memory", "timeout",
                    "worker_init_fn", "multiprocessing_context", "persistent_workers",
                    "pin_memory_device")


class EpochData:
    """Batches for ``fit`` and this rank's position in them, which a checkpoint records."""

    def __init__(self, data: Iterable[Any], seed: int, rank: int = 0, world_size: int = 1,
                 iterators: LoaderIterators | None = None) -> None:
        self.seed, self.rank, self.world_size = seed, rank, world_size
        # the epochs' iterators, whose workers end when fit does
        self.iterators = iterators if iterators is not None else LoaderIterators()
        self.epoch = 0
        self.batches = 0  # batches this rank consumed in this epoch (after ``_start``)
        self._start = 0  # units all ranks had consumed in this epoch when this run began it
        self._last_batch: int | None = None  # ``batches`` at this epoch's end, where known
        self._source = data
        self._loader, self._sampler, self._units_per_batch = _rebuild(data, seed, rank,
                                                                      world_size)

    @property
    def batch_size(self) -> int | None:
        """Samples in a batch, where the data says (a DataLoader's ``batch_size``)."""
        size = getattr(self._source, "batch_size", None)
        return size if isinstance(size, int) else None

    # -- the position ---------------------------------------------------------------------

    def position(self) -> dict[str, Any]:
        """Where the data stands, as plain data for a checkpoint."""
        position = {"epoch": self.epoch, "batch": self.batches, "seed": self.seed,
                    "world_size": self.world_size}
        if self._sampler is not None:
            position["consumed"] = self._consumed()
        return position

    def resume(self, position: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's ``position()``, refusing what cannot continue exactly."""
        self.epoch = int(position.get("epoch", 0))
        saved_world = int(position.get("world_size", 1))
        if self._sampler is not None and "consumed" in position:
            self._start, self.batches = int(position["consumed"]), 0
            if saved_world == self.world_size:  # the same split: count on from the same batch
                self._start, self.batches = 0, int(position.get("batch", 0))
            return
        if saved_world != self.world_size and position.get("batch", 0):
            raise ValueError(
                f"the checkpoint was written by {counted(saved_world, 'process', 'processes')} "
                f"part-way into epoch "
                f"{self.epoch}, and this data cannot be split again at that point under "
                f"{self.world_size}: resume with {saved_world}, or pass a DataLoader over a "
                "map-style dataset")
        self.batches = int(position.get("batch", 0))

    def consumed_any(self) -> bool:
        """Whether any of this epoch's data is behind this rank: trained on in this run,
        or before a resume (by any number of processes)."""
        return self._consumed() > 0 if self._sampler is not None else self.batches > 0

    def at_epoch_end(self) -> bool:
        """Whether this rank consumed the last batch of this epoch (known for data with a
        length, once ``epoch_batches`` began the epoch)."""
        return self._last_batch is not None and self.batches >= self._last_batch

    def next_epoch(self) -> None:
        self.epoch, self.batches, self._start = self.epoch + 1, 0, 0
        self._last_batch = None

    def _consumed(self) -> int:
        return self._start + self.world_size * self.batches * self._units_per_batch

    # -- the batches ----------------------------------------------------------------------

    def batches_per_epoch(self) -> int | None:
        """Batches in a whole epoch for this rank, when known."""
        if self._sampler is not None:
            units = math.ceil(self._sampler.units() / self.world_size)
            if self._units_per_batch == 1:
                return units
            drop = getattr(self._loader, "drop_last", False)
            per_batch = self._units_per_batch
            return units // per_batch if drop else math.ceil(units / per_batch)
        return _length(self._source)

    def check_reproducible(self) -> None:
        """ValueError when a custom sampler gives another order from the same seed."""
        sampler = self._custom_sampler()
        if sampler is not None and read_seeded(sampler, self.seed) != read_seeded(sampler,
                                                                                 self.seed):
            raise ValueError(
                f"the sampler {type(sampler).__name__} gives a different order each time from "
                "the same seed, so a resumed run would see other data: let it draw from its "
                "own torch.Generator (generator=...) or from torch's or Python's generator")

    def consumed(self, batches: int) -> None:
        """Count ``batches`` more as trained on (not merely read: loaders read ahead)."""
        self.batches += batches

    def epoch_batches(self) -> Iterator[Any]:
        """The rest of the current epoch's batches, from the position counted so far."""
        if self._loader is not None and self._sampler is not None:
            self._sampler.set_position(self.epoch, self._consumed())
            self._loader.generator.manual_seed(self.seed + self.epoch)  # worker seeds too
            self._last_batch = self.batches + len(self._loader)  # drop_last counted
            return self.iterators.iterate(self._loader)
        self._last_batch = _length(self._source)
        if self.batches:
            warn(f"resuming mid-epoch reads and discards {self.batches} batches: "
                 "use a DataLoader over a map-style dataset to skip them without "
                 "reading")
        return itertools.islice(self.iterators.iterate(self._source), self.batches, None)

    def _custom_sampler(self) -> Any:
        from torch.utils.data import DataLoader

        if not isinstance(self._source, DataLoader) or self._sampler is None:
            return None
        if _plain_sampler(self._source):
            return None
        return (self._source.sampler if self._source.batch_size is not None
                else self._source.batch_sampler)


def _length(data: Any) -> int | None:
    """``len(data)``, or None for data without one (a generator, an IterableDataset)."""
    try:
        return len(data)
    except TypeError:
        return None


def _plain_sampler(data: Any) -> bool:
    """Whether ``data`` shuffles (or not) every index once, as DataLoader(shuffle=...) does."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    sampler = data.sampler
    if isinstance(sampler, RandomSampler) and (sampler.replacement
                                               or sampler._num_samples is not None):
        return False
    return (isinstance(sampler, RandomSampler | SequentialSampler)
            and type(data.batch_sampler) is BatchSampler)


def _rebuild(data: Iterable[Any], seed: int, rank: int,
             world_size: int) -> tuple[Any, EpochSampler | None, int]:
    """A DataLoader equal to ``data`` but driven by an EpochSampler, when that is possible.

    Also returns the sampler and how many of its units make a batch.
    """
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    if not isinstance(data, DataLoader):
        return None, None, 1
    dataset: Any = data.dataset
    if (not hasattr(dataset, "__getitem__")
            or isinstance(dataset, torch.utils.data.IterableDataset)):
        return None, None, 1
    if _plain_sampler(data):
        order = shuffled_order(len(dataset),
                               isinstance(data.sampler, RandomSampler), seed)
    else:
        order = sampler_order(data.sampler if data.batch_size is not None
                              else data.batch_sampler, seed)
    batched = data.batch_size is None
    seeded = not draws_nothing(dataset)  # one that draws nothing is read as it is
    sampler = EpochSampler(order, rank, world_size, batched=batched, keyed=seeded)
    settings = {name: getattr(data, name) for name in _LOADER_SETTINGS if hasattr(data, name)}
    if data.num_workers > 0:
        settings["prefetch_factor"] = data.prefetch_factor
    settings["worker_init_fn"] = WorkerInit(settings.get("worker_init_fn"), os.getpid(),
                                            _trainer_is_parent(data))
    if seeded:
        dataset = SeededDataset(dataset, seed)
    loader: Any
    if batched:
        loader = DataLoader(dataset, batch_sampler=sampler, generator=torch.Generator(),
                            **settings)
        return loader, sampler, 1
    loader = DataLoader(dataset, batch_size=data.batch_size, sampler=sampler,
                        drop_last=data.drop_last, generator=torch.Generator(), **settings)
    return loader, sampler, data.batch_size or 1


def _trainer_is_parent(data: Any) -> bool:
    """Whether this process is the parent of the loader's workers (started by fork or
    spawn; a forkserver starts them as its own children)."""
    context = data.multiprocessing_context
    method = (context.get_start_method() if context is not None
              else multiprocessing.get_start_method(allow_none=True)
              or multiprocessing.get_all_start_methods()[0])  # the default, left unset
    return method in ("fork", "spawn")


def loader(dataset: Any, batch_size: int, shuffle: bool = True, **overrides: Any) -> Any:
    """A DataLoader set up for this machine: workers, pinned memory and persistence.

    Workers: one less than the usable cores (a 2-core Colab VM gets 1), at most 8, none for
    a single core. Pinned memory when an NVIDIA GPU is visible. Workers persist between
    epochs, and ``fit`` ends them when it returns or raises. Any DataLoader argument given
    here wins.
    """
    import torch
    from torch.utils.data import DataLoader

    from ipycloud.runtime.machine.snapshot import usable_cpus
    from ipycloud.runtime.train.device import usable_gpus

    cores = usable_cpus() or 1
    workers = overrides.pop("num_workers", max(0, min(8, int(cores) - 1)))
    settings: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": bool(usable_gpus()),
        "persistent_workers": workers > 0,
        "generator": torch.Generator().manual_seed(torch.initial_seed()),
    }
    settings.update(overrides)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, **settings)
