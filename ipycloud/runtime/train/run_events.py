"""The events of a run of ``fit`` as its callbacks hear them (see ``callback``): how it
starts, a metric that cannot rank epochs, an early stop, and how it ends, told once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ipycloud.runtime.runs.best import best_epoch
from ipycloud.runtime.train import resume as resuming
from ipycloud.runtime.train.callback import FAILED, PAUSED, RunEnd, RunStart
from ipycloud.runtime.train.early_stopping import EarlyStopping
from ipycloud.runtime.train.interrupt import FitInterrupted
from ipycloud.runtime.train.progress import Progress
from ipycloud.runtime.train.stop_control import Phase, first_line
from ipycloud.runtime.units import counted, finite_number
from ipycloud.runtime.user_warning import warn

if TYPE_CHECKING:
    from ipycloud.runtime.train.loop import _Trainer


class RunEvents:
    """Tells ``trainer``'s callbacks what happens to the run as a whole."""

    def __init__(self, trainer: _Trainer) -> None:
        self.trainer = trainer
        self._ended = False  # whether the callbacks were told how the run ended
        self._told_unranked: set[str] = set()  # metrics told of being NaN or infinite

    def start_of(self, curves: bool) -> RunStart:
        trainer = self.trainer
        plan, manager = trainer.plan, trainer.checkpoints.manager
        watched = self.watched()
        return RunStart(
            run=trainer.checkpoints.run_id(),
            folder=manager.directory if manager is not None else None, step=trainer.step,
            epoch=trainer.data.epoch, total_steps=trainer.total_steps(), epochs=plan.epochs,
            max_steps=plan.max_steps, main=trainer.main, curves=curves and trainer.main,
            past_steps=tuple(trainer.history.steps), past_epochs=tuple(trainer.history.epochs),
            details={"device": str(trainer.device), "precision": plan.precision.name,
                     "model": type(trainer.raw_model).__name__,
                     "parameters": sum(p.numel() for p in trainer.raw_model.parameters()),
                     "optimizer": type(trainer.optimizer).__name__,
                     "batch_size": trainer.data.batch_size,
                     "grad_accum": plan.grad_accum,
                     "world_size": trainer.rank_and_world()[1],
                     "watch": watched and {"metric": watched[0], "mode": watched[1]}})

    def watched(self) -> tuple[str, str] | None:
        """The metric the run's best epoch is judged by, and whether lower is better: the
        checkpoint's keep_best, else early stopping's."""
        trainer = self.trainer
        manager = trainer.checkpoints.manager
        if manager is not None and manager.keep_best is not None:
            return manager.keep_best[0], manager.keep_best[1]
        stopping = next((callback for callback in trainer.callbacks.user
                         if isinstance(callback, EarlyStopping)), None)
        return None if stopping is None else (stopping.metric, stopping.mode)

    def end(self, status: str, reason: str | None) -> None:
        trainer = self.trainer
        if self._ended:  # a SIGTERM's end was told before its signal was delivered
            return
        self._ended = True
        watched = self.watched()
        best = None if watched is None else best_epoch(trainer.history.epochs, *watched)
        trainer.callbacks.tell("on_end", RunEnd(status=status, reason=reason, step=trainer.step,
                                             epoch=trainer.data.epoch, best=best))

    def unranked(self, logs: dict[str, Any]) -> None:
        """Warn, once a run for each, of a metric that keep_best or EarlyStopping watches
        being NaN or infinite: it counts neither as the best nor as an improvement."""
        trainer = self.trainer
        for metric in self._ranking_metrics() - self._told_unranked:
            value = logs.get(metric)
            if isinstance(value, float) and not finite_number(value):
                self._told_unranked.add(metric)
                line = (f"ipycloud.fit: {metric} is {'NaN' if value != value else value} at "
                        f"epoch {logs['epoch']}: a value that is not a finite number counts "
                        "neither as the best (keep_best) nor as an improvement (EarlyStopping)")
                warn(line, RuntimeWarning)
                trainer.callbacks.tell("on_event", "metric_not_finite", line)

    def _ranking_metrics(self) -> set[str]:
        """The metrics that keep_best and EarlyStopping rank epochs by."""
        trainer = self.trainer
        metrics = {callback.metric for callback in trainer.callbacks.user
                   if isinstance(callback, EarlyStopping)}
        manager = trainer.checkpoints.manager
        if manager is not None and manager.keep_best is not None:
            metrics.add(manager.keep_best[0])
        return metrics

    def note_stop(self, bar: Progress) -> None:
        trainer = self.trainer
        reason = trainer.callbacks.stop_reason
        if reason and not trainer.history.stopped:
            trainer.history.stopped = f"{reason} (step {trainer.step})"
            bar.say(f"ipycloud.fit: {trainer.history.stopped}")
            trainer.callbacks.tell("on_event", "early_stop", trainer.history.stopped)

    def first_lines(self, resumed: Any, val_data: Any) -> list[str]:
        trainer = self.trainer
        plan = trainer.plan
        where = (f"resuming from {resumed.name} (step {resumed.step}, epoch "
                 f"{trainer.data.epoch}, batch {trainer.data.batches})" if resumed else "starting")
        world = (f", {counted(trainer.dist.world_size, 'process', 'processes')}"
                 if trainer.dist else "")
        plateau = (", ReduceLROnPlateau steps on train_loss (no val_data)"
                   if trainer.runner.steps_on_metric and val_data is None else "")
        lines = [f"ipycloud.fit: {where} on {trainer.device} ({plan.choice.reason}), "
                 f"{plan.precision.name} ({plan.precision.reason}){world}{plateau}"]
        changed = resuming.taken_from_checkpoint_line(trainer.checkpoints.changed)
        return trainer.checkpoints.notes + lines + ([changed] if changed else [])

    def complete_line(self, resumed: Any) -> str:
        trainer = self.trainer
        how = f"{trainer.history.stopped}; " if trainer.history.stopped else ""
        return (f"ipycloud.fit: already complete at step {trainer.step} (epoch "
                f"{trainer.data.epoch}) in {resumed.name}: {how}returning its history (pass "
                "resume=False to train again)")
    def _interrupted(self, error: KeyboardInterrupt) -> tuple[str, str]:
        """How an interrupt ended the run: paused where a checkpoint holds the step it
        stopped at (or none was asked for); failed where it stopped at once (a second
        interrupt) before saving that step, saying which checkpoint a rerun continues
        from (only the first rank saves; the last save is recorded by then)."""
        trainer = self.trainer
        saver = trainer.checkpoints.saver
        if isinstance(error, FitInterrupted) or saver is None or not trainer.main:
            return PAUSED, first_line(error)
        newest = saver.newest
        if newest is not None and newest.step == trainer.step:
            return PAUSED, first_line(error)
        where = (f"the newest checkpoint is step {newest.step}: rerunning continues from it"
                 if newest is not None else
                 "no checkpoint of this run was saved: rerunning starts over")
        line = (f"ipycloud.fit: interrupted at step {trainer.step} and stopped at once, "
                f"without saving it; {where}")
        trainer.bar.close()
        print(line, flush=True)
        return FAILED, f"KeyboardInterrupt: {line}"

    def fail(self, error: BaseException) -> None:
        """Tell how the run ended, and let the last good checkpoint finish writing."""
        trainer = self.trainer
        if trainer.stops.enter(Phase.ENDING) is Phase.ENDING:
            return
        if out_of_memory(error):
            trainer.callbacks.tell("on_event", "out_of_memory", first_line(error))
        trainer.checkpoints.report_last()
        if isinstance(error, KeyboardInterrupt):
            self.end(*self._interrupted(error))
        else:
            self.end(FAILED, first_line(error))


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is the accelerator (or the host) running out of memory."""
    import torch

    return (isinstance(error, (getattr(torch, "OutOfMemoryError", MemoryError), MemoryError))
            or (isinstance(error, RuntimeError) and "out of memory" in str(error).lower()))

