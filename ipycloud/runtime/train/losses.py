"""The loss ``fit`` uses when none is given: only where the choice is unambiguous."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LossRule:
    """How to get the loss from a model's outputs and the batch's targets."""

    name: str
    classification: bool = False  # accuracy is meaningful

    def compute(self, outputs: Any, targets: Any) -> Any:
        import torch

        if self.name == "model output":
            return outputs
        if self.name == "outputs.loss":
            return outputs["loss"] if isinstance(outputs, dict) else outputs.loss
        return torch.nn.functional.cross_entropy(outputs.float(), targets)


def pick_loss(outputs: Any, targets: Any) -> LossRule:
    """Decide from the first batch; raise ValueError naming what to pass when unsure."""
    import torch

    if isinstance(outputs, torch.Tensor) and outputs.ndim == 0:
        return LossRule("model output")
    if (isinstance(outputs, dict) and "loss" in outputs) or hasattr(outputs, "loss"):
        return LossRule("outputs.loss")
    if (isinstance(outputs, torch.Tensor) and isinstance(targets, torch.Tensor)
            and outputs.is_floating_point() and not targets.is_floating_point()
            and targets.dtype != torch.bool and outputs.ndim == targets.ndim + 1):
        return LossRule("cross-entropy", classification=True)
    shape = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
    target = (f"{tuple(targets.shape)} {targets.dtype}" if isinstance(targets, torch.Tensor)
              else type(targets).__name__)
    raise ValueError(f"fit cannot tell which loss fits outputs {shape} and targets {target}: "
                     "pass loss_fn=, e.g. torch.nn.functional.mse_loss")
