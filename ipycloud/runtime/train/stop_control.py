"""What may stop a run of ``fit`` from outside (the Stop button, a SIGTERM, another rank of
the group) and where the run stands when it comes: its ``Phase``, changed only by
``StopControl.enter``."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ipycloud.runtime.checkpoint import rng
from ipycloud.runtime.train.callback import PAUSED
from ipycloud.runtime.train.interrupt import (
    DeferredInterrupt,
    FitInterrupted,
    GroupStopped,
    Preemption,
)
from ipycloud.runtime.train.progress import Progress
from ipycloud.runtime.train.stop_vote import INTERRUPT, SIGTERM, StopVote

if TYPE_CHECKING:
    from ipycloud.runtime.train.loop import _Trainer

PREEMPTED_COPY_WAIT_S = 5.0  # at SIGTERM, how long the last copy back may take

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
    """One run's interrupt, SIGTERM and vote of the ranks, its phase, and what they do to
    ``trainer``'s run: pause it (saved), or end it at a SIGTERM (saved, where it can be)."""

    def __init__(self, trainer: _Trainer) -> None:
        self.trainer = trainer
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

    def pause_if_asked(self, bar: Progress) -> None:
        """After an interrupt: save where the run stands, say so, and stop the cell; after
        a SIGTERM, save and let the process end. In a process group the ranks first agree
        (a step late) on whether any of them got either, and stop together."""
        stop = self.agreed_stop()
        if stop is None:
            return
        kind, asker = stop
        if kind == SIGTERM:
            self.end_preempted(bar, asker)
        self.pause(bar)

    def pause(self, bar: Progress) -> None:
        """Save where the run stands, say so, and stop the cell (FitInterrupted)."""
        trainer = self.trainer
        trainer.read_losses()
        if trainer.checkpoints.manager is None:
            line = (f"ipycloud.fit: interrupted at step {trainer.step}; no checkpoint= was given, "
                    "so rerunning this cell starts over (the model keeps what it learned)")
        else:
            trainer.checkpoints.save_last(bar)
            line = f"ipycloud.fit: interrupted at step {trainer.step}; rerun this cell to continue"
        trainer.callbacks.tell("on_event", "pause", line)
        bar.close()
        print(line, flush=True)
        raise FitInterrupted(line)

    def save_on_sigterm(self) -> bool:
        """From the SIGTERM handler: where the live state is the last finished step's,
        save it now and return True; otherwise False, and the next step boundary saves."""
        trainer = self.trainer
        if self.phase not in STILL:
            return False
        line = self._say_preempted(trainer.bar, rng_states=self.rng_states)
        trainer.events.end(PAUSED, first_line(KeyboardInterrupt(line)))  # the signal ends it
        return True

    def end_preempted(self, bar: Progress, asker: int | None = None) -> None:
        """At a step boundary after a SIGTERM (to rank ``asker`` of the group, if not to
        this process): save, say so, and let the signal end the process; a rank that did
        not get the signal raises GroupStopped."""
        trainer = self.trainer
        trainer.read_losses()
        line = self._say_preempted(bar, rng_states=None, asker=asker)
        trainer.events.end(PAUSED, first_line(KeyboardInterrupt(line)))  # the signal ends it
        preemption = self.preemption
        assert preemption is not None
        if not preemption.requested:
            raise GroupStopped(f"{line} (rank {asker} got SIGTERM; this rank ends so that "
                               "the group can restart without it)")
        preemption.end()
        raise KeyboardInterrupt(line)  # the signal's handler let the process live

    def _say_preempted(self, bar: Progress, rng_states: dict[str, Any] | None,
                       asker: int | None = None) -> str:
        """Save where the run stands (the generators at ``rng_states``) and say so."""
        trainer = self.trainer
        who = "" if asker is None else f" to rank {asker}"
        news = f"SIGTERM{who} at step {trainer.step}: the machine is going away"
        bar.say(f"ipycloud.fit: {news}")
        trainer.callbacks.tell("on_event", "sigterm", news)
        if trainer.checkpoints.manager is None:
            line = (f"ipycloud.fit: stopped at step {trainer.step}; no checkpoint= was given, so "
                    "the run is lost with the process")
        else:
            trainer.checkpoints.save_last(bar, rng_states=rng_states,
                            copy_wait_s=PREEMPTED_COPY_WAIT_S)
            line = f"ipycloud.fit: saved step {trainer.step}; rerun this cell to continue"
        bar.close()
        if trainer.main:
            print(line, flush=True)
        return line


def first_line(error: BaseException) -> str:
    """``ValueError: the first line of its message``."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
