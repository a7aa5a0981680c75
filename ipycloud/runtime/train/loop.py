"""``fit``: a training loop inside the kernel that uses the hardware it got and resumes exactly.

One optimizer step is ``grad_accum`` micro-batches. Checkpoints are taken only between
optimizer steps and carry the model, optimizer, scheduler, GradScaler, the random
generator states, the position inside the epoch and the history, so rerunning the same
cell after a kernel restart continues the run bit for bit (on the CPU) instead of
starting over.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ipycloud.runtime.checkpoint import auto
from ipycloud.runtime.checkpoint.state import map_tensors
from ipycloud.runtime.train.data import EpochData
from ipycloud.runtime.train.device import DeviceChoice, choose_device
from ipycloud.runtime.train.history import History
from ipycloud.runtime.train.losses import LossRule, pick_loss
from ipycloud.runtime.train.precision import Precision, resolve_precision
from ipycloud.runtime.train.progress import Progress

LOG_EVERY = 10  # optimizer steps between reads of the loss (each read syncs the device)
MAX_SKIPPED_FP16_STEPS = 25


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the message names the step."""


@dataclass
class _Position:
    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch: int = 0  # micro-batches of this epoch consumed


@dataclass
class _Plan:
    """Everything fixed before the first step."""

    choice: DeviceChoice
    precision: Precision
    epochs: int | None
    max_steps: int | None
    grad_accum: int
    clip_grad_norm: float | None
    checkpoint_every_s: float | None
    checkpoint_every_steps: int | None
    callbacks: Sequence[Any] = field(default_factory=tuple)


def fit(model: Any, optimizer: Any, train_data: Iterable[Any], *, epochs: int | None = None,
        max_steps: int | None = None, loss_fn: Any = None, val_data: Iterable[Any] | None = None,
        scheduler: Any = None, precision: str = "auto", grad_accum: int = 1,
        clip_grad_norm: float | None = None, device: Any = "auto", checkpoint: Any = None,
        checkpoint_every: str | int = "10m", resume: bool | str | int = "auto",
        callbacks: Sequence[Any] = (), progress: bool = True, seed: int | None = None) -> History:
    """Train ``model`` with ``optimizer`` on ``train_data``; returns the History.

    - ``epochs`` or ``max_steps`` (optimizer steps) bounds the run; neither means 1 epoch.
    - ``loss_fn(outputs, targets)``; without it, a model that returns its own loss (a
      scalar, or an object or dict with ``loss``) uses that, and integer class labels with
      logits use cross-entropy. Anything else needs ``loss_fn``.
    - ``device="auto"`` picks CUDA, then XLA, then MPS, then CPU; ``precision="auto"``
      picks bf16 where the device runs it natively, else fp16 with a GradScaler on CUDA,
      else fp32.
    - ``grad_accum`` micro-batches make one optimizer step, equivalent to a larger batch;
      ``clip_grad_norm`` clips (after unscaling under fp16).
    - ``checkpoint`` (a folder or a CheckpointManager) is saved every ``checkpoint_every``
      ("10m", or an int number of steps) and at the end; ``resume="auto"`` continues from
      its latest checkpoint, mid-epoch included. ``resume=False`` starts afresh; a step or
      tag resumes from that checkpoint. Objects registered with ``%checkpoint auto`` are
      also saved between optimizer steps when their save is due.
    - ``callbacks`` may define ``on_step_end(step, logs)``, ``on_epoch_end(epoch, logs)``
      and ``on_checkpoint(info)``.
    - ``seed`` fixes the data order (default: ``torch.initial_seed()``).
    Inside ``ipycloud.launch`` the model is wrapped in DDP, each rank reads its share of
    the data, and only rank 0 writes checkpoints and shows progress.
    """
    import torch

    _check_arguments(model, optimizer, train_data, epochs, max_steps, grad_accum)
    choice = choose_device(device)
    plan = _Plan(
        choice=choice, precision=resolve_precision(precision, choice.device, choice.kind),
        epochs=epochs if epochs is not None or max_steps is not None else 1,
        max_steps=max_steps, grad_accum=grad_accum, clip_grad_norm=clip_grad_norm,
        checkpoint_every_s=_seconds(checkpoint_every), callbacks=tuple(callbacks),
        checkpoint_every_steps=checkpoint_every if isinstance(checkpoint_every, int) else None)
    trainer = _Trainer(model, optimizer, scheduler, loss_fn, plan,
                       seed if seed is not None else torch.initial_seed() % 2**31)
    return trainer.run(train_data, val_data, checkpoint, resume, progress)


class _Trainer:
    """One run of ``fit``: the live objects, the plan, and the loop over steps."""

    def __init__(self, model: Any, optimizer: Any, scheduler: Any, loss_fn: Any, plan: _Plan,
                 seed: int) -> None:
        from ipycloud.runtime.train import distributed

        self.plan, self.seed = plan, seed
        self.device = plan.choice.device
        self.raw_model = _move(model, optimizer, self.device)
        self.dist = distributed.distributed_info()
        self.main = distributed.is_main_process()
        self.model = distributed.wrap_for_distributed(self.raw_model, self.device)
        self.optimizer, self.scheduler = optimizer, scheduler
        self._steps_on_metric = scheduler is not None and _steps_on_metric(scheduler)
        self.scaler = plan.precision.scaler(self.device)
        self.loss_fn = loss_fn
        self.loss_rule: LossRule | None = None
        self.history = History(device=str(self.device), precision=plan.precision.name)
        self.position = _Position()
        self.xla = plan.choice.kind == "xla"
        self._losses: list[Any] = []  # micro-batch losses since the last read, on device
        self._unlogged_steps = 0
        self._moves_batches = not self.xla and self.device.type != "cpu"
        self._skipped_in_a_row = 0  # fp16 steps skipped by the scaler
        self._reported_checkpoint: str | None = None  # the last one told to callbacks

    # -- the run --------------------------------------------------------------------------

    def run(self, train_data: Iterable[Any], val_data: Iterable[Any] | None, checkpoint: Any,
            resume: bool | str | int, progress: bool) -> History:
        manager = _manager(checkpoint)
        resumed = self._resume(manager, resume) if manager is not None else None
        data = EpochData(train_data, self.seed, *self._rank_and_world())
        per_epoch = data.batches_per_epoch()
        if per_epoch == 0:
            raise ValueError("train_data is empty: it gave no batch")
        bar = Progress(progress and self.main)
        bar.say(self._first_line(resumed))
        bar.start(self._total_steps(per_epoch), self.position.step)
        last_save, saved_steps = time.monotonic(), self.position.step
        try:
            while not self._finished():
                started = time.monotonic()
                for _ in self._epoch_steps(data, bar):
                    if manager is not None and self._checkpoint_due(last_save, saved_steps):
                        self._log(bar)  # never checkpoint a NaN unseen
                        self._save(manager, blocking=False)
                        last_save, saved_steps = time.monotonic(), self.position.step
                    if self.main:
                        self._auto_checkpoint(bar)
                    if self._finished():
                        break
                else:
                    self._end_epoch(val_data, time.monotonic() - started, bar)
            self._log(bar)
            if manager is not None and saved_steps != self.position.step:
                self._save(manager, blocking=True)
            elif manager is not None:  # the last step is saved already: let it finish
                self._report_checkpoint(manager.wait())
        except BaseException:
            if manager is not None:  # let the last good checkpoint finish writing
                with contextlib.suppress(Exception):
                    manager.wait()
            raise
        finally:
            bar.close()
        return self.history

    def _epoch_steps(self, data: EpochData, bar: Progress) -> Iterator[None]:
        """Train through the rest of the current epoch, yielding after each optimizer step.

        Micro-batches left over at the end of the epoch make one last, smaller step.
        """
        batches = self._on_device(data.epoch(self.position.epoch, self.position.batch))
        self.model.train()
        pending, seen = 0, 0
        for batch in batches:
            seen += 1
            self._losses.append(self._micro_step(batch).detach())
            self.position.batch += 1
            pending += 1
            if pending == self.plan.grad_accum:
                pending = 0
                self._finish_step(bar)
                yield
        if pending:
            self._finish_step(bar)
            yield
        if not seen and not self.position.batch:
            raise ValueError("train_data is empty: it gave no batch" + (
                f" in epoch {self.position.epoch} (an iterator can be read only once: pass a "
                "DataLoader or a list)" if self.position.epoch else ""))
        self._log(bar)

    def _finish_step(self, bar: Progress) -> None:
        self._optimizer_step()
        self.position.step += 1
        self._unlogged_steps += 1
        if self._unlogged_steps == LOG_EVERY:
            self._log(bar)

    def _on_device(self, batches: Iterable[Any]) -> Iterable[Any]:
        """The batches on the training device: through torch_xla's loader on XLA."""
        if self.xla:
            from ipycloud.runtime.train import xla

            return xla.device_loader(batches, self.device)
        if self._moves_batches:
            return (_to_device(batch, self.device) for batch in batches)
        return batches

    def _forward(self, batch: Any) -> tuple[Any, Any, Any]:
        """Outputs, targets and loss of one batch, under the run's autocast."""
        inputs, targets = _split(batch)
        with self.plan.precision.autocast(self.device):
            outputs = _call(self.model, inputs)
            return outputs, targets, self._loss(outputs, targets, batch)

    def _micro_step(self, batch: Any) -> Any:
        _, _, loss = self._forward(batch)
        scaled = loss / self.plan.grad_accum if self.plan.grad_accum > 1 else loss
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return loss

    def _optimizer_step(self) -> None:
        import torch

        if self.plan.clip_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.plan.clip_grad_norm)
        if self.scaler is not None:
            self._scaled_step()
        elif self.xla:
            from ipycloud.runtime.train import xla

            xla.optimizer_step(self.optimizer)
        else:
            self.optimizer.step()
        if self.scheduler is not None and not self._steps_on_metric:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _scaled_step(self) -> None:
        """An fp16 step; overflowing steps are skipped by the scaler, but not forever."""
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self.scaler.get_scale() < scale
        self._skipped_in_a_row = self._skipped_in_a_row + 1 if skipped else 0
        if self._skipped_in_a_row >= MAX_SKIPPED_FP16_STEPS:
            raise NonFiniteLossError(
                f"fp16 gradients overflowed {self._skipped_in_a_row} optimizer steps in a "
                f"row, up to step {self.position.step + 1}: the loss scale fell to "
                f"{self.scaler.get_scale():g}; try precision='bf16' or 'fp32', or a lower "
                "learning rate")

    def _loss(self, outputs: Any, targets: Any, batch: Any) -> Any:
        if self.loss_fn is not None:
            return self.loss_fn(outputs, targets if targets is not None else batch)
        if self.loss_rule is None:
            self.loss_rule = pick_loss(outputs, targets)
        return self.loss_rule.compute(outputs, targets)

    def _log(self, bar: Progress) -> None:
        """Read the losses gathered since the last read (one device sync) and report them."""
        import torch

        losses, steps = self._losses, self._unlogged_steps
        if not losses or not steps:
            return
        self._losses, self._unlogged_steps = [], 0
        mean = float(torch.stack(losses).float().mean().item())
        if mean != mean or mean in (float("inf"), float("-inf")):
            first = self.position.step - steps + 1
            raise NonFiniteLossError(
                f"the loss is {mean} in optimizer steps {first} to {self.position.step} "
                f"(epoch {self.position.epoch}); earlier checkpoints are intact")
        lr = float(self.optimizer.param_groups[0]["lr"])
        row = {"step": self.position.step, "epoch": self.position.epoch, "loss": mean, "lr": lr}
        self.history.steps.append(row)
        bar.advance(steps, loss=mean, lr=lr)
        for callback in self.plan.callbacks:
            if hasattr(callback, "on_step_end"):
                callback.on_step_end(self.position.step, dict(row))

    def _end_epoch(self, val_data: Iterable[Any] | None, seconds: float, bar: Progress) -> None:
        logs: dict[str, Any] = {"epoch": self.position.epoch, "steps": self.position.step}
        epoch_steps = [row["loss"] for row in self.history.steps
                       if row["epoch"] == self.position.epoch]
        if epoch_steps:
            logs["train_loss"] = sum(epoch_steps) / len(epoch_steps)
        if val_data is not None:
            logs.update(self._validate(val_data))
            if self._steps_on_metric:
                self.scheduler.step(logs["val_loss"])
        logs["seconds"] = round(seconds, 3)
        self.history.epochs.append(logs)
        bar.say(f"epoch {self.position.epoch}: " + ", ".join(
            f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
            for key, value in logs.items() if key != "epoch"))
        for callback in self.plan.callbacks:
            if hasattr(callback, "on_epoch_end"):
                callback.on_epoch_end(self.position.epoch, dict(logs))
        self.position.epoch += 1
        self.position.batch = 0

    def _validate(self, val_data: Iterable[Any]) -> dict[str, float]:
        import torch

        self.model.eval()
        total, correct, count, batches = None, None, 0, 0  # sums stay on the device
        with torch.no_grad():
            for batch in self._on_device(val_data):
                outputs, targets, loss = self._forward(batch)
                loss = loss.detach().float()
                total = loss if total is None else total + loss
                batches += 1
                if self.loss_rule is not None and self.loss_rule.classification:
                    hits = (outputs.argmax(-1) == targets).sum()
                    correct = hits if correct is None else correct + hits
                    count += targets.numel()
        self.model.train()
        if total is None:
            raise ValueError("val_data is empty: it gave no batch")
        metrics = {"val_loss": float(total.item()) / batches}
        if correct is not None and count:
            metrics["val_accuracy"] = int(correct.item()) / count
        return metrics

    # -- bounds and checkpoints -----------------------------------------------------------

    def _finished(self) -> bool:
        if self.plan.max_steps is not None and self.position.step >= self.plan.max_steps:
            return True
        return self.plan.epochs is not None and self.position.epoch >= self.plan.epochs

    def _total_steps(self, per_epoch: int | None) -> int | None:
        if self.plan.max_steps is not None:
            return self.plan.max_steps
        if per_epoch is None or self.plan.epochs is None:
            return None
        return self.plan.epochs * -(-per_epoch // self.plan.grad_accum)  # a last, short step

    def _checkpoint_due(self, last_save: float, saved_steps: int) -> bool:
        if self.plan.checkpoint_every_steps is not None:
            return self.position.step - saved_steps >= self.plan.checkpoint_every_steps
        return (self.plan.checkpoint_every_s is not None
                and time.monotonic() - last_save >= self.plan.checkpoint_every_s)

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": _OnCpu(self.raw_model) if self.xla else self.raw_model,
                                 "optimizer": _OnCpu(self.optimizer) if self.xla
                                 else self.optimizer, "history": self.history.to_state()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler
        if self.scaler is not None:
            state["scaler"] = self.scaler
        return state

    def _save(self, manager: Any, blocking: bool) -> None:
        if not self.main:
            return
        position = {"epoch": self.position.epoch, "batch": self.position.batch,
                    "seed": self.seed}
        self._report_checkpoint(manager.wait())  # the previous save, done in the background
        manager.save(self._state(), self.position.step, epoch=self.position.epoch,
                     data_position=position, blocking=blocking)
        if blocking:
            self._report_checkpoint(manager.wait())

    def _auto_checkpoint(self, bar: Progress) -> None:
        """Save the ``%checkpoint auto`` objects when due: between steps their state is whole.

        Checks ``due()`` first so that the losses are read (and a NaN stops the run) before
        a save, never on the other steps.
        """
        registration = auto.registered()
        if registration is None or not registration.due():
            return
        self._log(bar)
        bar.say(f"ipycloud: automatic {registration.save_now().summary()}")

    def _report_checkpoint(self, info: Any) -> None:
        if info is None or info.name == self._reported_checkpoint:
            return
        self._reported_checkpoint = info.name
        for callback in self.plan.callbacks:
            if hasattr(callback, "on_checkpoint"):
                callback.on_checkpoint(info)

    def _resume(self, manager: Any, resume: bool | str | int) -> Any:
        if resume is False:
            return None
        has_checkpoints = manager.directory.is_dir() and bool(manager.list())
        if not has_checkpoints:
            if resume is True or (resume != "auto"):
                raise ValueError(f"nothing to resume from: no checkpoint in {manager.directory}")
            return None
        state = self._state()
        which = "latest" if resume in ("auto", True) else resume
        info = manager.load(state, which=which, map_location="cpu")
        self.history.restore(state["history"])
        position = info.data_position or {}
        self.position = _Position(info.step, position.get("epoch", 0), position.get("batch", 0))
        self.seed = position.get("seed", self.seed)
        return info

    def _rank_and_world(self) -> tuple[int, int]:
        return (self.dist.rank, self.dist.world_size) if self.dist is not None else (0, 1)

    def _first_line(self, resumed: Any) -> str:
        plan = self.plan
        where = (f"resuming from {resumed.name} (step {resumed.step}, epoch "
                 f"{self.position.epoch}, batch {self.position.batch})" if resumed
                 else "starting")
        world = f", {self.dist.world_size} processes" if self.dist else ""
        return (f"ipycloud.fit: {where} on {self.device} ({plan.choice.reason}), "
                f"{plan.precision.name} ({plan.precision.reason}){world}")


class _OnCpu:
    """A live object whose state_dict is moved to the CPU: XLA tensors cannot be saved."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def state_dict(self) -> Any:
        from ipycloud.runtime.train import xla

        return xla.to_cpu(self._obj.state_dict())

    def load_state_dict(self, state: Any) -> Any:
        return self._obj.load_state_dict(state)


def _move(model: Any, optimizer: Any, device: Any) -> Any:
    """Move ``model`` to ``device`` and point ``optimizer`` at the moved parameters.

    Moving to an XLA device makes new Parameter objects (CUDA and MPS keep the same ones),
    and an optimizer left holding the old ones would train a copy nobody uses.
    """
    before = list(model.parameters())
    model = model.to(device)
    moved = {id(old): new for old, new in zip(before, model.parameters(), strict=True)
             if old is not new}
    if moved:
        for group in optimizer.param_groups:
            group["params"] = [moved.get(id(param), param) for param in group["params"]]
        optimizer.state = defaultdict(dict, {
            moved.get(id(param), param): {key: value.to(device) if hasattr(value, "to")
                                          else value for key, value in state.items()}
            for param, state in optimizer.state.items()})
    return model


def _check_arguments(model: Any, optimizer: Any, train_data: Any, epochs: Any,
                     max_steps: Any, grad_accum: Any) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, not "
                        f"{type(optimizer).__name__}")
    if not isinstance(train_data, Iterable) or isinstance(train_data, str | bytes):
        raise TypeError(f"train_data must be a DataLoader or an iterable of batches, not "
                        f"{type(train_data).__name__}")
    if epochs is not None and max_steps is not None:
        raise ValueError("give epochs or max_steps, not both")
    for name, value in (("epochs", epochs), ("max_steps", max_steps), ("grad_accum", grad_accum)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name} must be a positive integer, not {value!r}")


def _seconds(every: str | int) -> float | None:
    from ipycloud.runtime.units import parse_duration

    if isinstance(every, bool):
        raise ValueError(f"checkpoint_every must be a duration like '10m' or a step count, "
                         f"not {every!r}")
    if isinstance(every, int):
        if every < 1:
            raise ValueError(f"checkpoint_every must be at least 1 step, not {every}")
        return None
    return parse_duration(every)


def _manager(checkpoint: Any) -> Any:
    from ipycloud.runtime.checkpoint import CheckpointManager, manager_for

    if checkpoint is None or isinstance(checkpoint, CheckpointManager):
        return checkpoint
    if isinstance(checkpoint, str | os.PathLike):
        return manager_for(checkpoint)
    raise TypeError("checkpoint must be a folder or a CheckpointManager, not "
                    f"{type(checkpoint).__name__}")


def _split(batch: Any) -> tuple[Any, Any]:
    """(inputs, targets) of a batch: a pair, a 1-tuple, a dict or a lone tensor."""
    if isinstance(batch, list | tuple):
        if len(batch) == 2:
            return batch[0], batch[1]
        if len(batch) == 1:
            return batch[0], None
        raise ValueError(f"a batch of {len(batch)} items is ambiguous: give (inputs, targets),"
                         " a dict, or a custom loss_fn with batches the model can take")
    return batch, None


def _call(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def _to_device(batch: Any, device: Any) -> Any:
    """Move every tensor of a batch (mappings, lists, tuples, namedtuples) to ``device``."""
    return map_tensors(batch, lambda tensor, _path: tensor.to(device, non_blocking=True))


def _steps_on_metric(scheduler: Any) -> bool:
    import torch

    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
