"""The ranks of a process group agree on when to stop for a SIGTERM.

A SIGTERM reaches the ranks one by one, or only those of one machine (a preempted node
of a cluster). Each rank would stop at the step where it noticed, and a rank that goes on
waits in the next all-reduce for ranks that have gone. So at every step boundary each
rank says whether it was asked to stop, in an all-reduce of one number on a gloo group of
its own, started without waiting and read one step later (by then long finished, so the
step does not wait for it). Every rank reads the same answer at the same step, and all
stop there: the first rank saves that step, whichever rank got the signal.
"""

from __future__ import annotations

from typing import Any


class StopVote:
    """One vote per step boundary, read a step later; made by every rank of the group."""

    def __init__(self, rank: int) -> None:
        import torch.distributed as dist

        self._rank = rank
        self._group = dist.new_group(backend="gloo")  # a collective: every rank makes it
        self._ballot: Any = None
        self._pending: Any = None

    def agree(self, asked: bool) -> int | None:
        """Cast this rank's vote for this boundary; returns the rank that asked to stop
        at the previous boundary (the highest, if several did), or None to go on."""
        import torch
        import torch.distributed as dist

        asker = None
        if self._pending is not None:
            self._pending.wait()
            highest = int(self._ballot.item())
            asker = highest - 1 if highest else None
        self._ballot = torch.tensor([self._rank + 1 if asked else 0], dtype=torch.int64)
        self._pending = dist.all_reduce(self._ballot, op=dist.ReduceOp.MAX,
                                        group=self._group, async_op=True)
        return asker

    def close(self) -> None:
        """After a run every rank finished: wait for the last vote (every rank cast it)
        and drop the group."""
        import torch.distributed as dist

        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()
        dist.destroy_process_group(self._group)
