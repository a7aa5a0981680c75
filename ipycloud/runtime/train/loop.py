"""``fit``: a training loop inside the kernel that uses the hardware it got and resumes exactly.

One optimizer step is ``grad_accum`` micro-batches, weighted so that the step equals one
larger batch. Checkpoints are taken only between optimizer steps and carry the model,
optimizer, scheduler, GradScaler, the random generator states, the position in the data
and the history, so rerunning the same cell after a kernel restart, or after
interrupting it, continues the run bit for bit (on the CPU) instead of starting over.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from ipycloud.runtime._optional import require
from ipycloud.runtime.checkpoint import CheckpointInfo, CheckpointManager
from ipycloud.runtime.runs.recorder import record_run
from ipycloud.runtime.train import resume as resuming
from ipycloud.runtime.train.alerts import run_alerts
from ipycloud.runtime.train.arguments import (
    RunPlan,
    check_arguments,
    check_epoch_metric,
    check_numbers,
    check_progress,
    check_release,
    checkpoint_manager,
    checkpoint_schedule,
)
from ipycloud.runtime.train.buckets import rebuilds_buckets, settle_buckets
from ipycloud.runtime.train.callback import (
    FAILED,
    FINISHED,
    PAUSED,
    STOPPED_EARLY,
    Callback,
    RunCallbacks,
    check_callbacks,
    own_callbacks,
)
from ipycloud.runtime.train.checkpointing import RunCheckpoints
from ipycloud.runtime.train.compiled import check_compile
from ipycloud.runtime.train.data import EpochData
from ipycloud.runtime.train.device import choose_device, move_to_device
from ipycloud.runtime.train.early_stopping import EarlyStopping
from ipycloud.runtime.train.history import History
from ipycloud.runtime.train.interrupt import (
    DeferredInterrupt,
    FitInterrupted,
    Preemption,
)
from ipycloud.runtime.train.precision import resolve_precision
from ipycloud.runtime.train.progress import Progress
from ipycloud.runtime.train.release import keep_machine, release_when_safe
from ipycloud.runtime.train.run_events import RunEvents
from ipycloud.runtime.train.step_runner import NonFiniteLossError, StepRunner
from ipycloud.runtime.train.stop_control import Phase, StopControl
from ipycloud.runtime.train.stop_vote import StopVote
from ipycloud.runtime.train.validation import check_metrics, validate
from ipycloud.runtime.train.workers import LoaderIterators

__all__ = ["NonFiniteLossError", "fit"]  # the first raised by the step runner

LOG_EVERY = 10  # optimizer steps between reads of the loss (each read syncs the device)


def fit(model: Any, optimizer: Any, train_data: Iterable[Any], *,
        epochs: int | None = None, max_steps: int | None = None,
        val_data: Iterable[Any] | None = None, loss_fn: Any = None,
        metrics: Mapping[str, Any] | None = None,
        scheduler: Any = None, grad_accum: int = 1, clip_grad_norm: float | None = None,
        device: Any = "auto", precision: str = "auto", compile: bool | str = False,
        checkpoint: Any = None, checkpoint_every: str | float | None = None,
        checkpoint_every_steps: int | None = None, resume: bool | str | int = "auto",
        release: bool = False,
        callbacks: Sequence[Callback] = (), log_every: int = LOG_EVERY,
        progress: bool | Literal["bar"] = True, seed: int | None = None) -> History:
    """Train ``model`` with ``optimizer`` on ``train_data``; returns the History.

    Everything after ``train_data`` is a keyword, in groups: how long; what to validate;
    how to step; where; checkpoints; what to tell and show.

    - ``epochs`` or ``max_steps`` (optimizer steps) bounds the run; neither means 1 epoch.
    - Batches are ``(inputs, targets)``, a lone input, or a mapping of the model's keyword
      arguments (a dict, a Hugging Face ``BatchEncoding``); inputs may be a mapping too.
    - ``loss_fn(outputs, targets)``; without it, a model that returns its own loss (a
      scalar, or ``outputs.loss``) uses that, and logits with integer class labels use
      cross-entropy (labels of -100 skipped). Anything else needs ``loss_fn``.
    - ``val_data`` is evaluated after every epoch: ``val_loss``, ``val_accuracy`` for
      classifiers, and ``val_<name>`` for each of ``metrics={name: fn(predictions, labels)}``;
      a value that is NaN or infinite is never the best or an improvement.
    - ``device="auto"`` picks CUDA, then XLA, then MPS, then CPU; ``precision="auto"``
      picks bf16 where the accelerator runs it natively, fp16 with a GradScaler on older
      GPUs, fp32 on CPUs. ``compile=True`` compiles the model (its repeated blocks
      alone where it has some; "whole" or "regional" to choose), its compile caches kept
      beside the checkpoints for the next session; off by default (slower on CPUs).
    - ``grad_accum`` micro-batches make one optimizer step that equals one larger batch
      (micro-batches weighted by their samples, or by their labels that count);
      ``clip_grad_norm`` clips (after unscaling under fp16).
    - ``checkpoint`` (a folder or a CheckpointManager) is saved every ``checkpoint_every``
      (a duration: "10m", "1h30m" or a number of seconds; 10 minutes by default) or,
      instead, every ``checkpoint_every_steps`` optimizer steps; also at every epoch's end
      when the manager keeps the best (``keep_best``; the epoch's metrics go with it), when
      interrupted, and at the end; a CheckpointManager's ``background`` decides whether
      the periodic ones are written in the background. ``resume="auto"`` continues from
      its latest checkpoint, mid-epoch included; ``resume=False`` starts afresh; True, a
      step or a tag resumes from that checkpoint. ``release=True``: see below.
    - ``callbacks``: ``ipycloud.Callback`` instances, told of the start, each step (the loss
      read every ``log_every`` steps, None in between), epoch, checkpoint, event and the
      end; a hook that raises StopTraining ends the run. ``EarlyStopping("val_loss",
      patience=3)`` stops after 3 epochs without improvement.
    - Interrupting (the Stop button, Ctrl-C) finishes the current step, saves a checkpoint
      and raises FitInterrupted, a KeyboardInterrupt that notebooks show as the one line it
      printed: rerunning the cell continues. A second interrupt
      stops at once.
    - ``progress=True`` shows a progress bar and, in a notebook, live charts of the loss
      (raw and smoothed), the learning rate and the validation metrics under it, redrawn
      at most once a second; ``"bar"`` shows the bar alone, False nothing.
    - ``seed`` (0 to 2**53, which a checkpoint keeps exactly) fixes the data order and
      every sample's random draws (default: ``torch.initial_seed()``).
    - ``release=True`` (with ``checkpoint=``) gives the machine back once the run has
      finished or stopped early, its final checkpoint read back and verified and every
      background sync of its folder through a final pass: on Colab the runtime is
      unassigned (only with the run on Drive, or synced there, and Drive flushed),
      elsewhere the kernel ends after this cell (a script ends). A run that fails or
      pauses, or a save, sync or flush that fails, keeps the machine and says why.
    Inside ``ipycloud.launch`` the model is wrapped in DDP, each rank reads its share of
    the data, and only rank 0 writes checkpoints and shows progress.
    """
    torch = require("torch", "torch")
    from ipycloud.runtime.train.distributed import check_group_started

    check_group_started()
    check_arguments(model, optimizer, train_data, epochs, max_steps, grad_accum, log_every)
    check_numbers(clip_grad_norm, seed)
    check_progress(progress)
    manager = checkpoint_manager(checkpoint)
    resuming.check_resume(resume, manager is not None)
    check_release(release, manager is not None)
    choice = choose_device(device)
    check_compile(compile, choice.device, choice.kind)
    plan = RunPlan(
        choice=choice, precision=resolve_precision(precision, choice.device, choice.kind),
        compile=compile,
        epochs=epochs if epochs is not None or max_steps is not None else 1,
        max_steps=max_steps, grad_accum=grad_accum, clip_grad_norm=clip_grad_norm,
        checkpoint_every=checkpoint_schedule(checkpoint_every, checkpoint_every_steps),
        log_every=log_every, metrics=check_metrics(metrics))
    user_callbacks = check_callbacks(callbacks)
    watched = [("EarlyStopping", callback.metric) for callback in user_callbacks
               if isinstance(callback, EarlyStopping)]
    if manager is not None and manager.keep_best:
        watched.append(("the checkpoint's keep_best", manager.keep_best[0]))
    for what, metric in watched:
        check_epoch_metric(metric, what, val_data is not None, plan.metrics)
    trainer = _Trainer(model, optimizer, scheduler, loss_fn, plan, RunCallbacks(user_callbacks),
                       seed if seed is not None else torch.initial_seed() % 2**31)
    try:
        history = trainer.run(train_data, val_data, manager, resume, progress)
    except BaseException as error:
        if release:
            keep_machine(f"the run {PAUSED if isinstance(error, KeyboardInterrupt) else FAILED}")
        if isinstance(error, FitInterrupted):  # raised again here: no frames of the loop shown
            raise error.with_traceback(None) from None
        raise
    finally:
        trainer.loaders.close()  # however the run ended: no worker outlives fit
    if release:
        trainer.release()
    return history


class _Trainer:
    """One run of ``fit``: the live objects, the plan, and the loop over steps."""

    def __init__(self, model: Any, optimizer: Any, scheduler: Any, loss_fn: Any, plan: RunPlan,
                 callbacks: RunCallbacks, seed: int) -> None:
        from ipycloud.runtime.train import distributed

        self.plan, self.callbacks, self.seed = plan, callbacks, seed
        self.device = plan.choice.device
        self.raw_model = move_to_device(model, optimizer, self.device)
        self.dist = distributed.distributed_info()
        self.main = distributed.is_main_process()
        self.model = distributed.wrap_for_distributed(self.raw_model, self.device)
        self.optimizer, self.scheduler = optimizer, scheduler
        self.runner = StepRunner(self.model, self.raw_model, optimizer, scheduler, loss_fn,
                                 self.device, plan.precision, plan.choice.kind == "xla",
                                 plan.clip_grad_norm)
        self.history = History(device=str(self.device), precision=plan.precision.name)
        self.step = 0  # optimizer steps taken
        self.data: EpochData = None  # type: ignore[assignment]  # set when the run starts
        self.loaders = LoaderIterators()  # what the run reads, its workers ended after it
        self.window: list[float] = []  # step losses read since the last logged row
        self.checkpoints = RunCheckpoints(self, None)  # the run's, once it starts
        self.bar = Progress(False)  # the run's, once it starts
        self.stops = StopControl(self)  # the interrupt, the SIGTERM, the vote and the phase
        self.events = RunEvents(self)  # what the callbacks are told of the run as a whole
        self._logged_at: tuple[int, float] | None = None  # (step, time) of the last row
        self._settling = False  # whether DDP's buckets are settled before the first step

    # -- the run --------------------------------------------------------------------------

    def run(self, train_data: Iterable[Any], val_data: Iterable[Any] | None,
            manager: CheckpointManager | None, resume: bool | str | int,
            progress: bool | Literal["bar"]) -> History:
        checkpoints = self.checkpoints = RunCheckpoints(self, manager)
        resumed = checkpoints.resume(resume)
        self.data = EpochData(train_data, self.seed, *self.rank_and_world(), self.loaders)
        if resumed is not None:
            self.data.resume(resumed.data_position or {})
            checkpoints.saved_at = self.position()
            self._settling = rebuilds_buckets(self.model, self.rank_and_world()[1])
        if manager is not None:
            self.data.check_reproducible()
        if self.data.batches_per_epoch() == 0:
            raise ValueError("train_data is empty: it gave no batch")
        bar = Progress(bool(progress) and self.main)
        if self._finished():
            bar.say(self.events.complete_line(resumed))
            if (checkpoints.writes and checkpoints.saver is not None and manager is not None
                    and resumed is not None and resumed.directory != manager.directory):
                bar.say(f"ipycloud.fit: {checkpoints.saver.finish()}")  # once copied back
            return self.history
        try:
            # From its first line on, the Stop button pauses the run.
            with DeferredInterrupt("ipycloud.fit: interrupted; stopping after this step "
                                   "(interrupt again to stop at once)") as self.stops.interrupt:
                self._start(resumed, val_data, progress, bar)
                stops = self.stops
                with Preemption(stops.save_on_sigterm, main=self.main) as stops.preemption:
                    self._train_or_fail(val_data, bar)
        except BaseException as error:
            self.events.fail(error)
            raise  # a vote still open is left: its peers may be gone
        finally:
            if self.runner.compiled is not None:
                self.runner.compiled.finish()
            bar.close()
            if checkpoints.saver is not None:
                checkpoints.saver.listener = None
        if self.stops.vote is not None:
            self.stops.vote.close()
        self.events.end(STOPPED_EARLY, self.history.stopped) if self.history.stopped \
            else self.events.end(FINISHED, None)
        return self.history

    def _start(self, resumed: CheckpointInfo | None, val_data: Iterable[Any] | None,
               progress: bool | Literal["bar"], bar: Progress) -> None:
        """Say how the run starts, and start its record and callbacks."""
        for line in self.events.first_lines(resumed, val_data):
            bar.say(line)
        if self.plan.compile:
            self.runner.compile(self.plan.compile, self.checkpoints.compile_cache(), bar.say)
        bar.start(self.total_steps(), self.step)
        self.bar = bar
        self.stops.captures_rng = self.checkpoints.writes
        self.stops.enter(Phase.STARTING)
        start = self.events.start_of(curves=progress is True)
        self.callbacks.join(own_callbacks(start, built_in=[record_run, run_alerts]))
        self.callbacks.tell("on_start", start)
        if resumed is not None:
            self.callbacks.tell("on_event", "resume", f"resuming from {resumed.name} (step "
                                f"{resumed.step}, epoch {self.data.epoch})")
        if self.checkpoints.saver is not None:  # what it tells of a failing folder
            self.checkpoints.saver.listener = functools.partial(self.callbacks.tell, "on_event")
        self._logged_at = (self.step, time.monotonic())
        if self.dist is not None and self.dist.world_size > 1:
            self.stops.vote = StopVote(self.dist.rank)

    def _train_or_fail(self, val_data: Iterable[Any] | None, bar: Progress) -> None:
        """Train; on an error, tell the run's end while a SIGTERM still waits for it."""
        preemption = self.stops.preemption
        assert preemption is not None
        try:
            self._train(val_data, bar)
        except Exception as error:
            if preemption.requested and self.stops.phase is Phase.FETCHING:
                self.stops.end_preempted(bar)  # its workers got the SIGTERM too
            # Still under Preemption: a SIGTERM now (torchrun sends one right after a
            # peer fails) waits until the end is told and the last save written, then
            # takes its course.
            self.events.fail(error)
            if preemption.requested:
                preemption.end()
            raise

    def release(self) -> None:
        """Give the machine back after a run that ended well (``fit(release=True)``)."""
        if self.dist is not None:
            if self.main:
                keep_machine("it does not apply inside launch, whose ranks share the machine")
        elif self.checkpoints.saver is not None:
            release_when_safe(self.checkpoints.saver, self.step)

    def _train(self, val_data: Iterable[Any] | None, bar: Progress) -> None:
        checkpoints = self.checkpoints
        keeps_best = checkpoints.manager is not None and checkpoints.manager.keep_best is not None
        if self.stops.vote is None and self.stops.interrupted:
            self.stops.pause(bar)  # Stop pressed as the run started: no step taken
        # A stop is noted before the step's or the epoch's save, which then holds it: a
        # rerun resumed from that save finds the run complete.
        while not self._finished():
            started = time.monotonic()
            for _ in self._epoch_steps(bar):
                self.events.note_stop(bar)
                self._between_steps(bar)
                if self._finished():
                    break
            else:
                self._end_epoch(val_data, time.monotonic() - started, bar)
                self.events.note_stop(bar)
                if keeps_best or checkpoints.due():
                    checkpoints.save(blocking="auto")
                self.stops.pause_if_asked(bar)
        self._log(bar)
        checkpoints.save_last(bar)

    def _between_steps(self, bar: Progress) -> None:
        # A save due at an epoch's last step waits for the epoch's end, a moment later,
        # where it is taken with the epoch's metrics (and is not taken twice).
        if self.checkpoints.due() and not self.data.at_epoch_end():
            self.checkpoints.save(blocking="auto")
        if self.main:
            self.checkpoints.auto_checkpoint(bar)
        self.stops.pause_if_asked(bar)

    def _epoch_steps(self, bar: Progress) -> Iterator[None]:
        """Train through the rest of the current epoch, yielding after each optimizer step.

        Micro-batches left over at the end of the epoch make one last, smaller step.
        """
        self.model.train()
        self.stops.enter(Phase.EPOCH_START)
        batches = self.stops.fetching(self.runner.on_device(self.data.epoch_batches()))
        if self._settling:
            batches = self._settled(batches)
        if self.plan.grad_accum == 1:  # the common case, on the shortest path
            for batch in batches:
                self.runner.train_batch(batch)
                self.data.consumed(1)
                self._finish_step(bar)
                yield
        else:
            for group in _groups(batches, self.plan.grad_accum):
                self.runner.train_group(group)
                self.data.consumed(len(group))
                self._finish_step(bar)
                yield
        if not self.data.consumed_any():
            raise ValueError("train_data is empty: it gave no batch" + (
                f" in epoch {self.data.epoch} (an iterator can be read only once: pass a "
                "DataLoader or a list)" if self.data.epoch else ""))
        self._log(bar)

    def _settled(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``, the first of them first run once through DDP to settle its
        buckets (see ``buckets``)."""
        first = next(batches, _END)
        if first is _END:
            return
        self._settling = False
        settle_buckets(self.model, lambda: self.runner.forward(first)[2])
        yield first
        yield from batches

    def _finish_step(self, bar: Progress) -> None:
        self.runner.optimizer_step(self.step + 1)
        self.step += 1
        row = self._log(bar) if self.step % self.plan.log_every == 0 else None
        if self.callbacks.per_step:
            self.callbacks.step(self.step, row or {
                "step": self.step, "epoch": self.data.epoch, "loss": None, "lr": self.runner.lr(),
                "steps_per_s": None, "samples_per_s": None})

    def restore(self, history: dict[str, Any], info: CheckpointInfo) -> None:
        """Take up where checkpoint ``info`` stands: its history, step and data seed."""
        self.history.restore(history)
        self.window = list(history.get("loss_window", []))
        self.step = info.step
        self.seed = (info.data_position or {}).get("seed", self.seed)

    def read_losses(self) -> None:
        """Bring the step losses to the host and stop the run at a NaN or infinite one."""
        self.window += self.runner.read_losses(self.step, self.data.epoch)

    def _log(self, bar: Progress) -> dict[str, Any] | None:
        """Report the mean loss of the steps since the last row, as a row of the history.

        Rows fall every ``log_every`` steps and at each epoch's end, wherever checkpoints
        were taken, so a resumed run's history equals the uninterrupted run's.
        """
        import torch

        self.read_losses()
        window, self.window = self.window, []
        if not window:
            return None
        mean = float(torch.tensor(window, dtype=torch.float32).mean())
        row = {"step": self.step, "epoch": self.data.epoch, "loss": mean, "lr": self.runner.lr()}
        self.history.steps.append(row)
        bar.advance(len(window), loss=mean, lr=row["lr"])
        told = {**row, **self._pace()}
        self.callbacks.row(self.step, told)
        self.checkpoints.report_written()
        return told

    def _pace(self) -> dict[str, float | None]:
        """Optimizer steps and samples a second since the previous logged row."""
        now = time.monotonic()
        last_step, last_time = self._logged_at or (self.step, now)
        self._logged_at = (self.step, now)
        if now <= last_time or self.step <= last_step:
            return {"steps_per_s": None, "samples_per_s": None}
        steps_per_s = (self.step - last_step) / (now - last_time)
        batch = self.data.batch_size
        samples = batch * self.plan.grad_accum * self.rank_and_world()[1] if batch else None
        return {"steps_per_s": steps_per_s,
                "samples_per_s": steps_per_s * samples if samples else None}

    def _end_epoch(self, val_data: Iterable[Any] | None, seconds: float, bar: Progress) -> None:
        epoch = self.data.epoch
        logs: dict[str, Any] = {"epoch": epoch, "steps": self.step}
        epoch_steps = [row["loss"] for row in self.history.steps if row["epoch"] == epoch]
        if epoch_steps:
            logs["train_loss"] = sum(epoch_steps) / len(epoch_steps)
        if val_data is not None:
            self.stops.enter(Phase.VALIDATING)
            self.model.eval()
            batches = self.runner.on_device(self.loaders.iterate(val_data))
            logs.update(validate(self.runner.eval_forward, batches, self.plan.metrics,
                                 self.runner.shifted))
            self.model.train()
            self.stops.enter(Phase.TRAINING)
        if self.runner.steps_on_metric:
            self.scheduler.step(logs["val_loss" if val_data is not None else "train_loss"])
        logs["seconds"] = round(seconds, 3)
        self.history.epochs.append(logs)
        bar.say(f"epoch {epoch}: " + ", ".join(
            f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
            for key, value in logs.items() if key != "epoch"))
        self.callbacks.tell("on_epoch", epoch, dict(logs))
        self.events.unranked(logs)
        self.data.next_epoch()

    # -- bounds, stops and checkpoints ----------------------------------------------------

    def _finished(self) -> bool:
        if self.history.stopped or self.callbacks.stop_reason:
            return True
        if self.plan.max_steps is not None and self.step >= self.plan.max_steps:
            return True
        return self.plan.epochs is not None and self.data.epoch >= self.plan.epochs

    # -- SIGTERM ----------------------------------------------------------------------------

    def total_steps(self) -> int | None:
        if self.plan.max_steps is not None:
            return self.plan.max_steps
        per_epoch = self.data.batches_per_epoch()
        if per_epoch is None or self.plan.epochs is None:
            return None
        return self.plan.epochs * -(-per_epoch // self.plan.grad_accum)  # a last, short step

    def position(self) -> tuple[int, int]:
        return self.step, self.data.epoch

    def rank_and_world(self) -> tuple[int, int]:
        return (self.dist.rank, self.dist.world_size) if self.dist is not None else (0, 1)



_END = object()  # the end of an epoch's batches


def _groups(batches: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive lists of ``size`` batches; the last may be shorter."""
    group: list[Any] = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group

