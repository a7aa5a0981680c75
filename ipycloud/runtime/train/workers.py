"""The worker processes of the DataLoaders ``fit`` reads end when ``fit`` ends.

A DataLoader with ``persistent_workers`` keeps its workers in its iterator from one epoch
to the next, and an iterator left mid-epoch (a run that stops or fails there) keeps them
until it is collected: held by a traceback, or in a reference cycle that only the garbage
collector frees, where torch's own shutdown no longer reaches them (the queues it signals
them through are finalized first). ``fit`` shuts its workers down itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


class LoaderIterators:
    """The iterators ``fit`` made over DataLoaders (the newest of each), whose worker
    processes ``close()`` ends."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[Any, Any]] = {}  # id(data): (data, its iterator)

    def iterate(self, data: Iterable[Any]) -> Iterator[Any]:
        """``iter(data)``, remembered where it runs worker processes."""
        iterator = iter(data)
        if hasattr(iterator, "_shutdown_workers"):  # torch's multi-process iterator
            self._open[id(data)] = (data, iterator)
        return iterator

    def close(self) -> None:
        """End the workers of every iterator made; a DataLoader whose workers persist
        starts new ones when read again."""
        while self._open:
            data, iterator = self._open.popitem()[1]
            iterator._shutdown_workers()
            if getattr(data, "_iterator", None) is iterator:
                data._iterator = None
