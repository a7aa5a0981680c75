"""Validation for ``fit``: the mean loss, accuracy for classifiers, and the user's metrics.

Accuracy is reported wherever the outputs are logits and the labels class indices: plain
classifiers, Hugging Face heads (sequence, token) and language models (next token),
skipping labels of -100. ``metrics={"f1": fn}`` calls ``fn(predictions, labels)`` once
per epoch on the whole validation set, on the CPU: the logits (or outputs) and labels of
every batch joined; for token-level labels, one row per label that counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ipycloud.runtime.train.batches import IGNORE_INDEX, labels_of
from ipycloud.runtime.train.losses import aligned, class_labels, logits_of
from ipycloud.runtime.units import as_float

Forward = Callable[[Any], tuple[Any, Any, Any]]  # batch -> (outputs, targets, loss)


def check_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Callable[..., Any]]:
    """The metrics as a dict of name -> callable, or a one-line error."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping) or not all(
            isinstance(name, str) and callable(fn) for name, fn in metrics.items()):
        raise TypeError("metrics must be a dict of name -> fn(predictions, labels), e.g. "
                        "{'f1': my_f1}")
    return dict(metrics)


def validate(forward: Forward, batches: Iterable[Any], metrics: Mapping[str, Any],
             shifted: bool) -> dict[str, float]:
    """``val_loss``, ``val_accuracy`` where it applies, and ``val_<name>`` for each metric."""
    import torch

    total, hits, count, batches_seen = None, None, None, 0  # sums stay on the device
    predictions: list[Any] = []
    labels_seen: list[Any] = []
    with torch.no_grad():
        for batch in batches:
            outputs, targets, loss = forward(batch)
            loss = loss.detach().float()
            total = loss if total is None else total + loss
            batches_seen += 1
            logits, labels = _aligned(outputs, labels_of(batch, targets), shifted)
            if class_labels(logits, labels):
                valid = labels != IGNORE_INDEX
                batch_hits = ((logits.argmax(-1) == labels) & valid).sum()
                hits = batch_hits if hits is None else hits + batch_hits
                count = valid.sum() if count is None else count + valid.sum()
            if metrics:
                kept = _rows(logits, labels)
                predictions.append(kept[0])
                labels_seen.append(kept[1])
    if total is None:
        raise ValueError("val_data is empty: it gave no batch")
    results = {"val_loss": float(total.item()) / batches_seen}
    if hits is not None and count is not None and int(count.item()):
        results["val_accuracy"] = int(hits.item()) / int(count.item())
    for name, fn in metrics.items():
        results[f"val_{name}"] = _metric(name, fn, predictions, labels_seen)
    return results


def _aligned(outputs: Any, labels: Any, shifted: bool) -> tuple[Any, Any]:
    logits = logits_of(outputs)
    if labels is None or logits is None:
        return logits, labels
    return aligned(logits, labels, shifted)


def _rows(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Predictions and labels of one batch on the CPU; token labels flattened to the valid."""
    if class_labels(logits, labels) and labels.ndim > 1:
        keep = labels.flatten() != IGNORE_INDEX
        return logits.flatten(0, -2)[keep].float().cpu(), labels.flatten()[keep].cpu()
    return (logits.detach().float().cpu() if logits is not None else None,
            labels.cpu() if labels is not None else None)


def _metric(name: str, fn: Callable[..., Any], predictions: list[Any],
            labels: list[Any]) -> float:
    import torch

    try:
        joined = torch.cat(predictions), (torch.cat(labels) if labels[0] is not None else None)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"metric {name!r} needs validation outputs that can be joined along "
                         f"the first dimension: {error}") from error
    value = fn(*joined)
    try:
        return as_float(value)  # an int beyond a float's range is infinite: it ranks nothing
    except (TypeError, ValueError) as error:
        raise TypeError(f"metric {name!r} returned {type(value).__name__}: it must return a "
                        "number") from error
