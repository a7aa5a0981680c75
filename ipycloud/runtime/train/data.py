"""Training data, epoch by epoch, able to start part-way into an epoch.

A DataLoader over a map-style dataset is rebuilt around ``EpochSampler``: each epoch's
order comes from ``seed + epoch`` alone, so a resumed run sees the same order, and the
batches already consumed are skipped by index, without loading them. Other iterables
are read from the start and the consumed batches discarded.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

_LOADER_SETTINGS = ("num_workers", "collate_fn", "pin_memory", "drop_last", "timeout",
                    "worker_init_fn", "multiprocessing_context", "persistent_workers",
                    "pin_memory_device")


class EpochSampler:
    """The sample indices of one epoch for one rank, from a given position on.

    Shuffled order is ``torch.randperm(length)`` seeded with ``seed + epoch``. With several
    ranks the order is padded to a multiple of the world size and dealt out round-robin,
    as torch's DistributedSampler does.
    """

    def __init__(self, length: int, shuffle: bool, seed: int, rank: int = 0,
                 world_size: int = 1) -> None:
        self.length, self.shuffle, self.seed = length, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.skip = 0  # samples of this epoch already consumed by this rank

    def set_position(self, epoch: int, skip: int) -> None:
        self.epoch, self.skip = epoch, skip

    def _order(self) -> list[int]:
        import torch

        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=generator).tolist()
        else:
            order = list(range(self.length))
        padded = math.ceil(self.length / self.world_size) * self.world_size
        order += order[:padded - len(order)]
        return order[self.rank::self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._order()[self.skip:])

    def __len__(self) -> int:
        return max(0, math.ceil(self.length / self.world_size) - self.skip)


class EpochData:
    """Batches for ``fit``, one epoch at a time, from any position in the epoch."""

    def __init__(self, data: Iterable[Any], seed: int, rank: int = 0,
                 world_size: int = 1) -> None:
        self.seed = seed
        self._source = data
        self._loader, self._sampler, self.batch_size = _rebuild(data, seed, rank, world_size)

    def batches_per_epoch(self) -> int | None:
        """Batches in a whole epoch for this rank, when known."""
        if self._sampler is not None and self.batch_size:
            samples = math.ceil(self._sampler.length / self._sampler.world_size)
            drop = getattr(self._loader, "drop_last", False)
            return samples // self.batch_size if drop else math.ceil(samples / self.batch_size)
        try:
            return len(self._source)  # type: ignore[arg-type]
        except TypeError:
            return None

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
        """The batches of ``epoch`` after the first ``skip_batches``."""
        if self._loader is not None and self._sampler is not None:
            self._sampler.set_position(epoch, skip_batches * (self.batch_size or 1))
            self._loader.generator.manual_seed(self.seed + epoch)  # worker seeds too
            return iter(self._loader)
        if skip_batches:
            warnings.warn(f"resuming mid-epoch reads and discards {skip_batches} batches: "
                          "use a DataLoader over a map-style dataset to skip them without "
                          "reading", stacklevel=3)
        return itertools.islice(iter(self._source), skip_batches, None)


def _rebuild(data: Iterable[Any], seed: int, rank: int,
             world_size: int) -> tuple[Any, EpochSampler | None, int | None]:
    """A DataLoader equal to ``data`` but driven by an EpochSampler, when that is possible."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

    if not isinstance(data, DataLoader):
        return None, None, None
    dataset = data.dataset
    plain_sampler = isinstance(data.sampler, RandomSampler | SequentialSampler)
    if (not plain_sampler or data.batch_size is None or not hasattr(dataset, "__getitem__")
            or isinstance(dataset, torch.utils.data.IterableDataset)):
        return None, None, data.batch_size
    length = len(dataset)  # type: ignore[arg-type]
    sampler = EpochSampler(length, isinstance(data.sampler, RandomSampler), seed, rank,
                           world_size)
    settings = {name: getattr(data, name) for name in _LOADER_SETTINGS if hasattr(data, name)}
    if data.num_workers > 0:
        settings["prefetch_factor"] = data.prefetch_factor
    loader = DataLoader(dataset, batch_size=data.batch_size, sampler=sampler,
                        generator=torch.Generator(), **settings)
    return loader, sampler, data.batch_size


def loader(dataset: Any, batch_size: int, shuffle: bool = True, **overrides: Any) -> Any:
    """A DataLoader set up for this machine: workers, pinned memory and persistence.

    Workers: one less than the usable cores (a 2-core Colab VM gets 1), at most 8, none for
    a single core. Pinned memory when an NVIDIA GPU is visible. Workers persist between
    epochs. Any DataLoader argument given here wins.
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
