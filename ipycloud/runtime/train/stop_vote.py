"""The ranks of a process group agree on when to stop for a SIGTERM or an interrupt.

A SIGTERM reaches the ranks one by one, or only those of one machine (a preempted node
of a cluster), and so does Ctrl-C (torchrun's agents pass it on to their workers each in
its time). Each rank would stop at the step where it noticed, and a rank that goes on
waits in the next all-reduce for ranks that have gone (or meets their save in it). So at
every step boundary each rank says whether, and how, it was asked to stop, in an
all-reduce of one number on a gloo group of its own, started without waiting and read
one step later (by then long finished, so the step does not wait for it). Every rank
reads the same answer at the same step, and all stop there, a SIGTERM before an
interrupt: the first rank saves that step, whichever rank was asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INTERRUPT, SIGTERM = 1, 2  # what a rank can be asked; the higher wins
RANKS = 1 << 24  # more ranks than any group has: a ballot is kind * RANKS + rank + 1


@dataclass(frozen=True)
class Stop:
    """What the ranks agreed on: ``kind`` (INTERRUPT or SIGTERM), asked of rank ``asker``
    (the highest, if several ranks were)."""

    kind: int
    asker: int


class StopVote:
    """One vote per step boundary, read a step later; made by every rank of the group."""

    def __init__(self, rank: int) -> None:
        import torch.distributed as dist

        self._rank = rank
        self._group = dist.new_group(backend="gloo")  # a collective: every rank makes it
        self._ballot: Any = None
        self._pending: Any = None

    def agree(self, asked: int | None) -> Stop | None:
        """Cast this rank's vote for this boundary (``asked``: INTERRUPT, SIGTERM or None);
        returns the stop the ranks asked for at the previous boundary, the strongest, or
        None to go on."""
        import torch
        import torch.distributed as dist

        stop = None
        if self._pending is not None:
            self._pending.wait()
            kind, rank = divmod(int(self._ballot.item()), RANKS)
            stop = Stop(kind, rank - 1) if kind else None
        ballot = asked * RANKS + self._rank + 1 if asked else 0
        self._ballot = torch.tensor([ballot], dtype=torch.int64)
        self._pending = dist.all_reduce(self._ballot, op=dist.ReduceOp.MAX,
                                        group=self._group, async_op=True)
        return stop

    def close(self) -> None:
        """After a run every rank finished: wait for the last vote (every rank cast it)
        and drop the group."""
        import torch.distributed as dist

        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()
        dist.destroy_process_group(self._group)
