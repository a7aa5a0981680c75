"""``EarlyStopping``: the callback that ends a run whose metric stopped improving."""

from __future__ import annotations

from typing import Any

from ipycloud.runtime.train.callback import Callback, RunStart, StopTraining
from ipycloud.runtime.units import counted, finite_number

MODES = ("min", "max", "auto")


class EarlyStopping(Callback):
    """Stop when ``metric`` (an epoch's ``train_loss`` or ``val_*``) has not improved for
    ``patience`` epochs in a row; ``mode="min"`` when lower is better, ``"max"`` when higher
    is, ``"auto"``: min for a metric named like a loss, else max. An epoch whose value is NaN
    or infinite is never an improvement. A resumed run counts from the epochs it already
    had, so patience spans restarts."""

    def __init__(self, metric: str, patience: int = 3, mode: str = "auto") -> None:
        if not isinstance(metric, str) or not metric:
            raise TypeError(f"EarlyStopping's metric is an epoch metric's name such as "
                            f"'val_loss', not {metric!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"EarlyStopping's patience is a number of epochs >= 1, not "
                             f"{patience!r}")
        if mode not in MODES:
            raise ValueError(f"EarlyStopping's mode is 'min', 'max' or 'auto', not {mode!r}")
        self.metric, self.patience = metric, patience
        self.mode = ("min" if "loss" in metric else "max") if mode == "auto" else mode
        self._reset()

    def _reset(self) -> None:
        self.best: float | None = None
        self.best_epoch = 0
        self.waited = 0

    def on_start(self, start: RunStart) -> None:
        """Catch up on the epochs of a resumed run, so patience counts across the restart."""
        self._reset()
        for logs in start.past_epochs:
            self._judge(logs["epoch"], logs)

    def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        if self._judge(epoch, logs):
            raise StopTraining(self._reason())

    def _judge(self, epoch: int, logs: dict[str, Any]) -> bool:
        """Whether the run has waited ``patience`` epochs without improving, after ``logs``."""
        value = logs.get(self.metric)
        if not isinstance(value, int | float):
            names = ", ".join(key for key, item in logs.items()
                              if isinstance(item, float)) or "none"
            raise ValueError(f"EarlyStopping watches {self.metric!r}, which the epoch's "
                             f"metrics do not have (they have: {names})")
        if finite_number(value) and (self.best is None or (
                value < self.best if self.mode == "min" else value > self.best)):
            self.best, self.best_epoch, self.waited = float(value), epoch, 0
            return False
        self.waited += 1
        return self.waited >= self.patience

    def _reason(self) -> str:
        epochs = counted(self.waited, "epoch")
        return (f"early stop: {self.metric} has not been a finite number for {epochs}"
                if self.best is None else
                f"early stop: {self.metric} has not improved for {epochs} since epoch "
                f"{self.best_epoch} ({self.best:.4g})")
