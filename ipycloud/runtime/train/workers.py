"""The worker processes of the DataLoaders ``fit`` reads end when ``fit`` ends.

A DataLoader with ``persistent_workers`` keeps its workers in its iterator from one epoch
to the next, and an iterator left mid-epoch (a run that stops or fails there) keeps them
until it is collected: held by a traceback, or in a reference cycle that only the garbage
collector frees, where torch's own shutdown no longer reaches them (the queues it signals
them through are finalized first). ``fit`` shuts its workers down itself.

Under torch's "file_system" sharing strategy a batch a worker sent is a file in shared
memory until it is received, and one never received stays until the process exits: the
batches still in flight are received and dropped first.

torch's shutdown ends the workers but leaves the iterator's pipes open (a queue's reader and
writer, each worker's sentinel) and the batches it received out of order, in shared memory:
held by a traceback, they would stay open until it goes. ``fit`` releases them too, and
a spawn context's semaphores and resource tracker (``semaphores``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ipycloud.runtime.train import semaphores

DRAIN_S = 5.0  # at most, for the workers to hand over the batches they were asked for


class LoaderIterators:
    """The iterators ``fit`` made over DataLoaders (the newest of each), whose worker
    processes ``close()`` ends."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[Any, Any]] = {}  # id(data): (data, its iterator)
        self._tracker_was_running = semaphores.tracker_running()

    def iterate(self, data: Iterable[Any]) -> Iterator[Any]:
        """``iter(data)``, remembered where it runs worker processes."""
        iterator = iter(data)
        if not hasattr(iterator, "_shutdown_workers"):  # not torch's multi-process iterator
            return iterator
        self._open[id(data)] = (data, iterator)
        return _unlinking_once_opened(iterator) if semaphores.still_named(iterator) else iterator

    def close(self) -> None:
        """End the workers of every iterator made; a DataLoader whose workers persist
        starts new ones when read again."""
        closed = bool(self._open)
        while self._open:
            data, iterator = self._open.popitem()[1]
            if _shares_by_file():
                _drop_batches_in_flight(iterator)
            iterator._shutdown_workers()
            _release_descriptors(iterator)
            semaphores.unlink_semaphores(iterator)
            if getattr(data, "_iterator", None) is iterator:
                data._iterator = None
        if closed and not self._tracker_was_running and semaphores.tracker_running():
            semaphores.stop_tracker()  # started for the loaders' semaphores: see semaphores


def _unlinking_once_opened(iterator: Any) -> Iterator[Any]:
    """``iterator``'s batches; after each, until done, its semaphores' files are removed
    if every worker has opened them (see ``semaphores``)."""
    for batch in iterator:
        yield batch
        if semaphores.opened_by_every_worker(iterator):
            semaphores.unlink_semaphores(iterator)
            yield from iterator
            return


def _shares_by_file() -> bool:
    import torch.multiprocessing

    return bool(torch.multiprocessing.get_sharing_strategy() == "file_system")


def _drop_batches_in_flight(iterator: Any) -> None:
    """Receive and drop the batches ``iterator``'s workers were asked for and that it has
    not received, for at most DRAIN_S (a worker that died or hangs ends the wait)."""
    # torch's _MultiProcessingDataLoaderIter: a task's info is (worker,) until received;
    # a worker whose iterable dataset ran out answers no more.
    waiting = {index for index, info in iterator._task_info.items()
               if len(info) == 1 and iterator._workers_status[info[0]]}
    deadline = time.monotonic() + DRAIN_S
    with contextlib.suppress(RuntimeError):  # a worker that died: nothing more comes
        while waiting and (left := deadline - time.monotonic()) > 0:
            received, item = iterator._try_get_data(timeout=left)
            if received:
                waiting.discard(item[0])


def _release_descriptors(iterator: Any) -> None:
    """Close the pipes of ``iterator``, whose workers were shut down, and drop the batches
    it received ahead of their turn (each holds a descriptor in shared memory)."""
    for queue in (*iterator._index_queues, iterator._worker_result_queue):
        _close_queue(queue)
    for worker in iterator._workers:
        with contextlib.suppress(ValueError):  # one still running keeps its sentinel
            worker.close()
    iterator._task_info.clear()


def _close_queue(queue: Any) -> None:
    """Close both ends of a multiprocessing queue of this process."""
    queue.cancel_join_thread()
    queue.close()  # a feeder thread, where one started, closes both ends as it ends
    if queue._thread is None:
        queue._reader.close()
        queue._writer.close()
    else:
        queue._thread.join(DRAIN_S)
