"""What may stop a run of ``fit`` from outside (the Stop button, a SIGTERM, another rank of
the group) and where the run stands when it comes: its ``Phase``, changed only by
``StopControl.enter``."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import Any

from ipycloud.runtime.checkpoint import rng
from ipycloud.runtime.train.interrupt import DeferredInterrupt, Preemption
from ipycloud.runtime.train.stop_vote import INTERRUPT, SIGTERM, StopVote

_END = object()  # the end of an epoch's batches


class Phase(enum.Enum):
    """Where the run stands, for a SIGTERM. In the still phases (STARTING, EPOCH_START,
    VALIDATING) the live state is that of the last finished step, and the random
    generators' as they were when the phase began: a SIGTERM there is saved at once."""

    STARTING = "starting"
    EPOCH_START = "epoch start"  # until the first batch, as the loader starts its workers
    VALIDATING = "validating"
    FETCHING = "fetching"  # waiting for the next batch
    TRAINING = "training"
    SAVING = "saving"
    ENDING = "ending"  # after a failure: the end told, the last save waited for


STILL = (Phase.STARTING, Phase.EPOCH_START, Phase.VALIDATING)


class StopControl:
    """One run's interrupt, SIGTERM and vote of the ranks, and its phase."""

    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self.captures_rng = False  # whether a still phase keeps the generators' states
        self.rng_states: dict[str, Any] = {}  # as they were when the still phase began
        self.interrupt: DeferredInterrupt | None = None
        self.preemption: Preemption | None = None
        self.vote: StopVote | None = None  # the ranks' agreement on when to stop

    def enter(self, phase: Phase) -> Phase:
        """Begin ``phase`` (the only place the phase changes); returns the one it ends. A
        still phase keeps the generators' states, where this process saves (one returned
        to after a save keeps those it had)."""
        previous = self.phase
        if self.captures_rng and phase in STILL and previous is not Phase.SAVING:
            self.rng_states = rng.capture_rng_states()
        self.phase = phase
        return previous

    def fetching(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches``, the phase saying when the loop waits for the next one."""
        iterator = iter(batches)
        while True:
            if self.phase is not Phase.EPOCH_START:
                self.enter(Phase.FETCHING)
            batch = next(iterator, _END)
            if batch is _END:
                return
            self.enter(Phase.TRAINING)
            yield batch

    @property
    def preempted(self) -> bool:
        """Whether this process got a SIGTERM."""
        return self.preemption is not None and self.preemption.requested

    @property
    def interrupted(self) -> bool:
        """Whether this process was interrupted (the Stop button)."""
        return self.interrupt is not None and self.interrupt.requested

    def agreed_stop(self) -> tuple[int, int | None] | None:
        """At a step boundary: whether to stop, as (SIGTERM or INTERRUPT, the rank that got
        the SIGTERM when not this process). In a process group the ranks first agree (a
        step late) on whether any of them got either, and stop together."""
        if self.vote is None:
            return ((SIGTERM, None) if self.preempted else
                    (INTERRUPT, None) if self.interrupted else None)
        stop = self.vote.agree(SIGTERM if self.preempted else
                               INTERRUPT if self.interrupted else None)
        if stop is None:
            return None
        return stop.kind, stop.asker if stop.kind == SIGTERM else None
