"""The best epoch of a run by the metric it watches (keep_best's, else early_stop's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ipycloud.runtime.units import finite_number


def best_epoch(epochs: Iterable[Mapping[str, Any]], metric: str,
               mode: str) -> dict[str, Any] | None:
    """``{"metric", "value", "epoch"}`` of the epoch whose ``metric`` is lowest (``mode``
    "min") or highest ("max"), the earliest of equals; None where no epoch has it as a
    finite number (NaN and infinities rank nothing)."""
    best: dict[str, Any] | None = None
    for logs in epochs:
        value = logs.get(metric)
        if not finite_number(value):
            continue
        if best is None or (value < best["value"] if mode == "min" else value > best["value"]):
            best = {"metric": metric, "value": float(value), "epoch": logs.get("epoch")}
    return best
