"""The loss ``fit`` uses when none is given: only where the choice is unambiguous."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipycloud.runtime.train.batches import IGNORE_INDEX


@dataclass(frozen=True)
class LossRule:
    """How to get the loss from a model's outputs and the batch's targets."""

    name: str  # "model output", "outputs.loss" or "cross-entropy"
    shifted: bool = False  # a causal LM: position t predicts label t + 1

    @property
    def counts_labels(self) -> bool:
        """Whether the loss averages over the labels that are not -100 (else over samples)."""
        return self.name != "model output"

    def compute(self, outputs: Any, targets: Any) -> Any:
        import torch

        if self.name == "model output":
            return outputs
        if self.name == "outputs.loss":
            return outputs["loss"] if isinstance(outputs, Mapping) else outputs.loss
        logits, targets = aligned(logits_of(outputs), targets, self.shifted)
        if logits.dtype != torch.float32:
            logits = logits.float()
        if logits.ndim > 2:  # one row per token
            logits, targets = logits.flatten(0, -2), targets.flatten()
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)


def aligned(logits: Any, labels: Any, shifted: bool) -> tuple[Any, Any]:
    """Logits and the labels they predict: for a causal LM, position t predicts label t + 1."""
    return (logits[..., :-1, :], labels[..., 1:]) if shifted else (logits, labels)


def logits_of(outputs: Any) -> Any:
    """The logits in a model's outputs: the outputs themselves, or their ``logits``."""
    if isinstance(outputs, Mapping):
        return outputs.get("logits")
    return getattr(outputs, "logits", outputs)


def own_loss(outputs: Any) -> Any:
    """The loss a model computed itself (``outputs.loss`` or ``outputs["loss"]``), or None."""
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    return getattr(outputs, "loss", None)


def class_labels(logits: Any, targets: Any) -> bool:
    """Whether ``targets`` are class indices for ``logits`` (one more dimension, of classes)."""
    import torch

    return (isinstance(logits, torch.Tensor) and isinstance(targets, torch.Tensor)
            and logits.is_floating_point() and not targets.is_floating_point()
            and targets.dtype != torch.bool and logits.ndim == targets.ndim + 1
            and logits.shape[:-1] == targets.shape)


def pick_loss(outputs: Any, targets: Any, shifted: bool = False) -> LossRule:
    """Decide from the first batch; raise ValueError naming what to pass when unsure.

    ``shifted``: the model is a causal LM, whose logits at t predict label t + 1.
    """
    import torch

    if isinstance(outputs, torch.Tensor) and outputs.ndim == 0:
        return LossRule("model output")
    if own_loss(outputs) is not None:
        return LossRule("outputs.loss")
    logits = logits_of(outputs)
    if class_labels(logits, targets):
        return LossRule("cross-entropy", shifted)
    raise ValueError(_no_loss_message(outputs, logits, targets))


def _no_loss_message(outputs: Any, logits: Any, targets: Any) -> str:
    import torch

    shape = (tuple(logits.shape) if isinstance(logits, torch.Tensor)
             else type(outputs).__name__)
    if targets is None:
        return (f"fit cannot tell which loss fits outputs {shape} without targets: give "
                "batches of (inputs, targets), labels the model computes its loss from, or "
                "pass loss_fn=")
    integer = isinstance(targets, torch.Tensor) and not targets.is_floating_point()
    target = (f"{tuple(targets.shape)} {targets.dtype}" if isinstance(targets, torch.Tensor)
              else type(targets).__name__)
    example = ("torch.nn.functional.cross_entropy" if integer
               else "torch.nn.functional.mse_loss")
    return (f"fit cannot tell which loss fits outputs {shape} and targets {target}: "
            f"pass loss_fn=, e.g. {example}")
