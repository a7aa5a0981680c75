"""The maths of one optimizer step of ``fit``: batches on the device, forward and backward
under the run's precision, accumulation over micro-batches (DDP's ``no_sync`` on all but
the last), clipping, the optimizer's step (through the GradScaler under fp16, torch_xla's
on XLA) and the scheduler's."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipycloud.runtime.train import batches as batch_parts
from ipycloud.runtime.train.losses import LossRule, pick_loss
from ipycloud.runtime.train.precision import Precision

if TYPE_CHECKING:
    from ipycloud.runtime.train.compiled import CompiledModel

MAX_SKIPPED_FP16_STEPS = 25


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the message names the step."""


class StepRunner:
    """Runs optimizer steps of ``model`` (wrapped for DDP, or ``raw_model`` itself) with
    ``optimizer`` on ``device``, and gathers their losses on the device."""

    def __init__(self, model: Any, raw_model: Any, optimizer: Any, scheduler: Any,
                 loss_fn: Any, device: Any, precision: Precision, xla: bool,
                 clip_grad_norm: float | None) -> None:
        self.model, self.raw_model, self.device, self.xla = model, raw_model, device, xla
        self.optimizer, self.scheduler, self.loss_fn = optimizer, scheduler, loss_fn
        self.precision, self.clip_grad_norm = precision, clip_grad_norm
        self.no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel's
        self.steps_on_metric = scheduler is not None and _steps_on_metric(scheduler)
        self.scaler = precision.scaler(device)
        self.loss_rule: LossRule | None = None
        self.shifted = batch_parts.shifts_labels(raw_model)
        self.moves_batches = not xla and device.type != "cpu"
        self.skipped_in_a_row = 0  # fp16 steps skipped by the scaler
        self.compiled: CompiledModel | None = None  # set by fit(compile=...)
        self.losses: list[Any] = []  # step losses since the last read, on the device

    def on_device(self, batches: Iterable[Any]) -> Iterable[Any]:
        """The batches on the training device: through torch_xla's loader on XLA."""
        if self.xla:
            from ipycloud.runtime.train import xla

            return xla.device_loader(batches, self.device)
        if self.moves_batches:
            return (batch_parts.to_device(batch, self.device) for batch in batches)
        return batches

    def forward(self, batch: Any) -> tuple[Any, Any, Any]:
        """Outputs, targets and loss of one batch, under the run's autocast."""
        inputs, targets = batch_parts.split(batch)
        with self.precision.autocast(self.device):
            outputs = batch_parts.call(self.model, inputs)
            return outputs, targets, self._loss(outputs, targets, batch)

    def compile(self, choice: bool | str, cache: Path | None, say: Callable[[str], None]
                ) -> None:
        """Compile the model for the steps to come (see ``compiled``), and say how."""
        from ipycloud.runtime.train.compiled import CompiledModel

        self.compiled = CompiledModel(self.raw_model, choice, cache, say)
        say(f"ipycloud.fit: {self.compiled.start()}")

    def eval_forward(self, batch: Any) -> tuple[Any, Any, Any]:
        """``forward`` for validation: eagerly where the model is compiled (eval mode would
        compile a second graph)."""
        if self.compiled is None:
            return self.forward(batch)
        return self.compiled.eagerly(lambda: self.forward(batch))

    def train_batch(self, batch: Any) -> None:
        """Forward and backward over an optimizer step of one batch."""
        self.losses.append(self._micro_step(batch, None).detach())

    def _micro_step(self, batch: Any, weight: Any) -> Any:
        """Forward and backward of one batch, its loss weighted by ``weight`` (when not
        None), compiled or eagerly as the compiled model decides; the loss."""
        if self.compiled is None:
            return self._backward(batch, weight)
        return self.compiled.step(batch, lambda: self._backward(batch, weight))

    def _backward(self, batch: Any, weight: Any) -> Any:
        _, _, loss = self.forward(batch)
        if weight is not None:
            loss = loss * weight
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss

    def train_group(self, group: list[Any]) -> None:
        """Forward and backward over one optimizer step's micro-batches.

        Each micro-batch's mean loss is weighted by its share of the group's items, so the
        gradient equals that of the group as one batch; under DDP only the last one
        all-reduces.
        """
        weights = self._weights(group) if len(group) > 1 else None
        step_loss = None
        for index, batch in enumerate(group):
            with self._gradient_sync(index == len(group) - 1):
                loss = self._micro_step(batch, None if weights is None else weights[index])
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        self.losses.append(step_loss)

    def _weights(self, group: list[Any]) -> list[Any]:
        counts_labels = self.loss_fn is None
        counts = [batch_parts.items_in(batch, batch_parts.split(batch)[1], shifted=self.shifted,
                                       counts_labels=counts_labels) for batch in group]
        total = sum(counts)
        return [count / total for count in counts]

    def _gradient_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if last or self.no_sync is None else self.no_sync()

    def optimizer_step(self, step: int) -> None:
        """Step ``step`` (counted from 1): clip, step the optimizer and the scheduler."""
        if self.clip_grad_norm is not None:
            import torch

            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        if self.scaler is not None:
            self._scaled_step(step)
        elif self.xla:
            from ipycloud.runtime.train import xla

            xla.optimizer_step(self.optimizer)
        else:
            self.optimizer.step()
        if self.scheduler is not None and not self.steps_on_metric:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _scaled_step(self, step: int) -> None:
        """An fp16 step; overflowing steps are skipped by the scaler, but not forever."""
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self.scaler.get_scale() < scale
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        if self.skipped_in_a_row >= MAX_SKIPPED_FP16_STEPS:
            raise NonFiniteLossError(
                f"fp16 gradients overflowed {self.skipped_in_a_row} optimizer steps in a "
                f"row, up to step {step}: the loss scale fell to "
                f"{self.scaler.get_scale():g}; try precision='bf16' or 'fp32', or a lower "
                "learning rate")

    def _loss(self, outputs: Any, targets: Any, batch: Any) -> Any:
        if self.loss_fn is not None:
            return self.loss_fn(outputs, targets if targets is not None else batch)
        labels = batch_parts.labels_of(batch, targets)
        if self.loss_rule is None:
            self.loss_rule = pick_loss(outputs, labels, self.shifted)
        return self.loss_rule.compute(outputs, labels)

    def read_losses(self, step: int, epoch: int) -> list[float]:
        """The step losses gathered on the device, brought to the host (one device sync);
        NonFiniteLossError at a NaN or infinite one (``step`` is the last's, in ``epoch``)."""
        if not self.losses:
            return []
        import torch

        values: list[float] = torch.stack(self.losses).float().cpu().tolist()
        self.losses = []
        if not all(map(math.isfinite, values)):
            raise NonFiniteLossError(
                f"the loss is {sum(values) / len(values)} in optimizer steps "
                f"{step - len(values) + 1} to {step} (epoch {epoch}); earlier checkpoints "
                "are intact")
        return values

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])


def _steps_on_metric(scheduler: Any) -> bool:
    import torch

    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
