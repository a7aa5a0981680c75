"""Callbacks for ``fit``: the user's hooks and the built-in early stopping; any may stop the run.

A callback may define ``on_step_end(step, logs)``, ``on_epoch_end(epoch, logs)`` and
``on_checkpoint(info)``. A hook that returns True, or a callback whose ``stop`` attribute
becomes True, stops training after the current step (or epoch); its ``reason``, if it
has one, says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ipycloud.runtime.units import counted, finite_number

MODES = ("min", "max")


class EarlyStopping:
    """Stop when ``metric`` has not improved for ``patience`` epochs in a row; an epoch
    whose value is NaN or infinite is never an improvement."""

    def __init__(self, metric: str, patience: int, mode: str) -> None:
        self.metric, self.patience, self.mode = metric, patience, mode
        self.best: float | None = None
        self.best_epoch = 0
        self.waited = 0
        self.reason: str | None = None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> bool:
        value = logs.get(self.metric)
        if not isinstance(value, int | float):
            names = ", ".join(key for key, item in logs.items()
                              if isinstance(item, float)) or "none"
            raise ValueError(f"early_stop watches {self.metric!r}, which the epoch's metrics "
                             f"do not have (they have: {names})")
        if finite_number(value) and (self.best is None or (
                value < self.best if self.mode == "min" else value > self.best)):
            self.best, self.best_epoch, self.waited = float(value), epoch, 0
            return False
        self.waited += 1
        if self.waited < self.patience:
            return False
        epochs = counted(self.waited, "epoch")
        self.reason = (f"early stop: {self.metric} has not been a finite number for {epochs}"
                       if self.best is None else
                       f"early stop: {self.metric} has not improved for {epochs} since epoch "
                       f"{self.best_epoch} ({self.best:.4g})")
        return True

    def replay(self, epochs: Iterable[dict[str, Any]]) -> None:
        """Catch up on the epochs of a resumed run, so patience counts across the restart."""
        for logs in epochs:
            self.on_epoch_end(logs["epoch"], logs)
        self.reason = None


def early_stopping(spec: Sequence[Any] | None) -> EarlyStopping | None:
    """``(metric, patience)`` or ``(metric, patience, "min"|"max")``; mode defaults to
    "min" for a metric named like a loss, else "max"."""
    if spec is None:
        return None
    if (isinstance(spec, str) or not isinstance(spec, Sequence) or len(spec) not in (2, 3)
            or not isinstance(spec[0], str) or isinstance(spec[1], bool)
            or not isinstance(spec[1], int) or spec[1] < 1
            or (len(spec) == 3 and spec[2] not in MODES)):
        raise ValueError("early_stop is (metric, patience >= 1[, 'min' or 'max']), e.g. "
                         f"('val_loss', 3), not {spec!r}")
    mode = spec[2] if len(spec) == 3 else ("min" if "loss" in spec[0] else "max")
    return EarlyStopping(spec[0], spec[1], mode)


class Callbacks:
    """Calls a hook on every callback that has it and notes whether one asked to stop."""

    def __init__(self, callbacks: Sequence[Any]) -> None:
        self.callbacks = tuple(callbacks)
        self.stop_reason: str | None = None

    def call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            method = getattr(callback, hook, None)
            if method is None:
                continue
            asked = method(*args) is True
            if (asked or getattr(callback, "stop", False) is True) and not self.stop_reason:
                self.stop_reason = (getattr(callback, "reason", None)
                                    or f"{type(callback).__name__}.{hook} asked to stop")
