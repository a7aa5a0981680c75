"""What ``fit`` does with one batch: split it, call the model, move it, count what it weighs.

Batches may be ``(inputs, targets)`` pairs, 1-tuples, lone tensors, or mappings (a dict,
Hugging Face's ``BatchEncoding``) that are the model's keyword arguments; in a pair, the
inputs may be a mapping too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ipycloud.runtime.checkpoint.state import map_tensors

IGNORE_INDEX = -100  # the label value losses skip (torch's cross-entropy, Hugging Face)


def split(batch: Any) -> tuple[Any, Any]:
    """(inputs, targets) of a batch; targets are None when the batch carries none apart."""
    if isinstance(batch, list | tuple):
        if len(batch) == 2:
            return batch[0], batch[1]
        if len(batch) == 1:
            return batch[0], None
        raise ValueError(f"a batch of {len(batch)} items is ambiguous: give (inputs, targets), "
                         "or a dict of the model's keyword arguments (its collate_fn can "
                         "build either)")
    return batch, None


def call(model: Any, inputs: Any) -> Any:
    """The model's outputs: a mapping of inputs is passed as keyword arguments."""
    return model(**inputs) if isinstance(inputs, Mapping) else model(inputs)


def to_device(batch: Any, device: Any) -> Any:
    """Move every tensor of a batch (mappings, lists, tuples, namedtuples) to ``device``."""
    return map_tensors(batch, lambda tensor, _path: tensor.to(device, non_blocking=True))


def labels_of(batch: Any, targets: Any) -> Any:
    """The batch's labels: its targets, or the ``labels`` of a mapping batch."""
    if targets is not None:
        return targets
    return batch.get("labels") if isinstance(batch, Mapping) else None


def shifts_labels(model: Any) -> bool:
    """Whether the model predicts label ``t + 1`` at position ``t`` (a causal language model).

    Read from what Hugging Face models declare: ``loss_type == "ForCausalLM"``, or the
    causal-LM loss as their ``loss_function`` (a model of one's own may set either);
    encoder-decoder models see their labels unshifted.
    """
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    if getattr(model, "loss_type", None) == "ForCausalLM":
        return True
    loss_function = getattr(model, "loss_function", None)
    return getattr(loss_function, "__name__", None) == "ForCausalLMLoss"


def items_in(batch: Any, targets: Any, *, shifted: bool, counts_labels: bool) -> Any:
    """How many items the batch's mean loss averages over: an int or a 0-dim tensor.

    Labels that count are those not equal to -100 (one fewer per row for a causal LM, or
    the batch's ``shift_labels``) when ``counts_labels``; otherwise the batch's first
    dimension. A group of accumulated micro-batches is weighted by these counts, so it
    equals one larger batch.
    """
    if counts_labels:
        labels = _counted_labels(batch, targets, shifted)
        if labels is not None and not labels.is_floating_point():
            return (labels != IGNORE_INDEX).sum()
    return batch_size(targets if targets is not None else batch)


def _counted_labels(batch: Any, targets: Any, shifted: bool) -> Any:
    if isinstance(batch, Mapping) and batch.get("shift_labels") is not None:
        return batch["shift_labels"]
    labels = labels_of(batch, targets)
    if labels is not None and shifted:
        return labels[..., 1:]
    return labels


def batch_size(value: Any) -> int:
    """The first dimension of the first tensor found in ``value``."""
    sizes: list[int] = []

    def note(tensor: Any, _path: Any) -> Any:
        if not sizes and tensor.ndim:
            sizes.append(int(tensor.shape[0]))
        return tensor

    map_tensors(value, note)
    return sizes[0] if sizes else 1
