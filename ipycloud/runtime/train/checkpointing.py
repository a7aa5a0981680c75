"""The checkpoints of a run of ``fit``: which one it resumes from and loading it, when a save
is due, saving (around a failing folder, through ``ResilientSaver``), and telling the
callbacks of each checkpoint written."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ipycloud.runtime.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    CheckpointManager,
    CheckpointMismatchError,
    CheckpointStorageError,
    auto,
)
from ipycloud.runtime.checkpoint.resilient import (
    FINAL_COPY_WAIT_S,
    ResilientSaver,
    resilient_saver,
)
from ipycloud.runtime.train import resume as resuming
from ipycloud.runtime.train.arguments import unreadable_at_start
from ipycloud.runtime.train.compiled import cache_file
from ipycloud.runtime.train.progress import Progress
from ipycloud.runtime.train.stop_control import Phase
from ipycloud.runtime.train.xla import OnCpu

if TYPE_CHECKING:
    from ipycloud.runtime.train.loop import _Trainer


class RunCheckpoints:
    """The checkpoints of ``trainer``'s run in ``manager``'s folder; None: no checkpoint=
    (every method is then a no-op, and ``resume`` finds nothing)."""

    def __init__(self, trainer: _Trainer, manager: CheckpointManager | None) -> None:
        self.trainer, self.manager = trainer, manager
        self.saver: ResilientSaver | None = None if manager is None else resilient_saver(manager)
        self.saved_at: tuple[int, int] | None = None  # (step, epoch) of the last save
        self._last_save = time.monotonic()
        self._reported: str | None = None  # the last one told to the callbacks
        self._unreported = False  # whether a save may be written and not told of yet
        # The checkpoint the run continues from (its name and folder), if it resumed.
        self.resumed_from: tuple[str, Any] | None = None
        self.notes: list[str] = []  # said before the first step
        self.changed: list[str] = []  # settings a resumed checkpoint replaced

    @property
    def writes(self) -> bool:
        """Whether this process writes the checkpoints (the first rank, with checkpoint=)."""
        return self.saver is not None and self.trainer.main

    # -- saving ---------------------------------------------------------------------------

    def due(self) -> bool:
        """Whether a periodic save is due (checkpoint_every or checkpoint_every_steps)."""
        if self.manager is None:
            return False
        trainer = self.trainer
        saved_step = self.saved_at[0] if self.saved_at else 0
        seconds, steps = trainer.plan.checkpoint_every
        if steps is not None:
            return trainer.step - saved_step >= steps
        return seconds is not None and time.monotonic() - self._last_save >= seconds

    def save(self, blocking: bool | Literal["auto"],
             rng_states: dict[str, Any] | None = None) -> None:
        """Save now; ``"auto"`` writes in the background where that costs the loop less.

        A failing folder never ends the run: the saver writes around it (``resilient``).
        ``rng_states``: the generators' states to record, if not as they are now.
        """
        trainer = self.trainer
        trainer.read_losses()  # never checkpoint a NaN unseen (every rank checks)
        self.saved_at, self._last_save = trainer.position(), time.monotonic()
        if not self.writes:
            return
        assert self.saver is not None
        phase = trainer.stops.enter(Phase.SAVING)
        try:
            self.report(self.saver.wait())  # the previous, in the background
            self.saver.save(self.state(), trainer.step, epoch=trainer.data.epoch,
                            data_position=trainer.data.position(),
                            metrics=self._epoch_metrics(), blocking=blocking,
                            rng_states=rng_states)
            if blocking is True:
                self.report(self.saver.wait())
            self._unreported = blocking is not True
        finally:
            trainer.stops.enter(phase)

    def save_last(self, bar: Progress, rng_states: dict[str, Any] | None = None,
                  copy_wait_s: float = FINAL_COPY_WAIT_S) -> None:
        """Save where the run stands unless that is saved (a background save that failed
        is saved again), then say where the newest checkpoint is. CheckpointError when no
        checkpoint of the run exists anywhere."""
        if self.manager is None:
            return
        if self.saved_at != self.trainer.position():
            self.save(blocking=True, rng_states=rng_states)
        elif self.writes:
            assert self.saver is not None
            self.report(self.saver.wait())
            if self.saver.lost is not None:
                self.save(blocking=True, rng_states=rng_states)
        if not self.writes:
            return
        assert self.saver is not None
        where = self.saver.finish(copy_wait_s)
        if where is not None:
            bar.say(f"ipycloud.fit: {where}")
        elif self.resumed_from is None:
            raise CheckpointError(f"no checkpoint of this run could be saved, in "
                                  f"{self.manager.directory} or in its fallback folder "
                                  f"{self.manager.fallback}: the trained model is only in "
                                  "memory")

    def auto_checkpoint(self, bar: Progress) -> None:
        """Save the ``%checkpoint auto`` objects when due: between steps their state is whole.

        Checks ``due()`` first so that the losses are read (and a NaN stops the run) before
        a save, never on the other steps.
        """
        registration = auto.registered()
        if registration is None or not registration.due():
            return
        self.trainer.read_losses()
        bar.say(f"ipycloud: automatic {registration.save_now().summary()}")

    def state(self) -> dict[str, Any]:
        """What a checkpoint of the run holds: the live objects and the history."""
        trainer = self.trainer
        history = {**trainer.history.to_state(), "loss_window": list(trainer.window)}
        xla, runner = trainer.runner.xla, trainer.runner
        state: dict[str, Any] = {
            "model": OnCpu(runner.raw_model) if xla else runner.raw_model,
            "optimizer": OnCpu(runner.optimizer) if xla else runner.optimizer,
            "history": history}
        if runner.scheduler is not None:
            state["scheduler"] = runner.scheduler
        if runner.scaler is not None:
            state["scaler"] = runner.scaler
        return state

    def _epoch_metrics(self) -> dict[str, float] | None:
        """The last epoch's metrics, for a checkpoint taken right at that epoch's end."""
        trainer = self.trainer
        if trainer.data.batches or not trainer.history.epochs:
            return None
        logs = trainer.history.epochs[-1]
        if logs["epoch"] != trainer.data.epoch - 1:
            return None
        return {key: value for key, value in logs.items()
                if isinstance(value, float) and key != "seconds"}

    # -- telling ----------------------------------------------------------------------------

    def report(self, info: CheckpointInfo | None) -> None:
        """Tell the callbacks of ``info``, once, if this call wrote it."""
        if info is None or info.name == self._reported:
            return
        self._reported = info.name
        if self.resumed_from != (info.name, info.directory):  # one this call wrote
            self.trainer.callbacks.tell("on_checkpoint", info)

    def report_written(self) -> None:
        """Tell of a save written in the background since, without waiting for one still
        being written (the next save would tell of it, minutes later)."""
        if self._unreported and self.saver is not None and self.manager is not None \
                and not self.manager.writing:
            self._unreported = False
            self.report(self.saver.wait())

    def report_last(self) -> None:
        """Wait for a save still being written, and tell of it before the run's end."""
        if self.saver is not None:
            try:
                self.report(self.saver.wait())
            except Exception:  # the run is failing: its own error is the one to show
                return

    def run_id(self) -> str | None:
        """The id of the run the checkpoints go to, where this process writes them."""
        if self.manager is None or not self.trainer.main:
            return None
        try:
            return str(self.manager.run_id())
        except CheckpointStorageError:  # the folder fails: its record goes under a new id
            return None

    def compile_cache(self) -> Path | None:
        """Where this process keeps the run's compile caches: in the checkpoint folder,
        where it writes the checkpoints; else nowhere."""
        if not self.writes or self.manager is None:
            return None
        return cache_file(Path(self.manager.directory), self.trainer.device)

    # -- resuming ---------------------------------------------------------------------------

    def resume(self, resume: bool | str | int) -> CheckpointInfo | None:
        """The checkpoint the run continues from, loaded; None to start afresh. In a
        process group the first rank chooses and loads it, and the others load the one
        it loaded: a rank that looked for itself could see another (one being written,
        or the first rank's lease making the run look like another process's)."""
        if self.manager is None:
            return None
        dist_info = self.trainer.dist
        if dist_info is None or dist_info.world_size == 1:
            return self._choose_and_load(resume)
        import torch.distributed as dist

        chosen: list[Any] = [None]
        info = None
        if self.trainer.main:
            try:
                info = self._choose_and_load(resume)
                chosen[0] = None if info is None else info.name
            except Exception as error:
                chosen[0] = error
        dist.broadcast_object_list(chosen, src=0)
        if isinstance(chosen[0], Exception):
            raise chosen[0]
        if self.trainer.main or chosen[0] is None:
            return info
        return self._load(chosen[0])

    def _choose_and_load(self, resume: bool | str | int) -> CheckpointInfo | None:
        which = self._choose(resume)
        return None if which is None else self._load(which)

    def _choose(self, resume: bool | str | int) -> str | int | None:
        """What ``resume`` asks to load from the folder, or None to start afresh."""
        manager = self.manager
        if resume is False or manager is None:
            return None
        try:
            saved = manager.list()
        except CheckpointStorageError as error:
            raise unreadable_at_start(manager.directory, error.__cause__ or error) from error
        except CheckpointError:  # no folder yet
            saved = []
        if not saved:
            if resume != "auto":
                raise ValueError(f"nothing to resume from: no checkpoint in {manager.directory}")
            return None
        others = manager.live_writers()
        if resume == "auto" and all(info.run in others for info in saved):
            names = ", ".join(writer.describe() for writer in others.values())
            self.notes.append(f"ipycloud.fit: starting afresh: the checkpoints in "
                              f"{manager.directory} belong to a run that another live "
                              f"process ({names}) writes")
            return None
        return "latest" if resume == "auto" or resume is True else resume

    def _load(self, which: str | int) -> CheckpointInfo:
        """Load checkpoint ``which`` into the live objects and the run's position."""
        trainer, manager = self.trainer, self.manager
        assert manager is not None
        optimizer, scheduled = trainer.runner.optimizer, trainer.runner.scheduler is not None
        before = resuming.hyper_parameters(optimizer, scheduled)
        state = self.state()
        try:
            info = manager.load(state, which=which, map_location="cpu")
        except CheckpointMismatchError as error:
            raise CheckpointError(f"cannot resume from {manager.directory}: {error.reason}; "
                                  "pass resume=False to start afresh, or another "
                                  "checkpoint= folder") from None
        trainer.restore(state["history"], info)
        self.resumed_from = (info.name, info.directory)
        if self.writes:
            assert self.saver is not None
            self.saver.resumed(info)  # from the fallback folder: copied back
        self.changed = resuming.changed_settings(
            before, resuming.hyper_parameters(optimizer, scheduled))
        return info
