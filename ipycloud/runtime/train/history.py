"""What ``fit`` returns: the metrics of every logged step and every epoch."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from ipycloud.runtime.tables import aligned_lines, html_table
from ipycloud.runtime.train.curves import TrainingCurves
from ipycloud.runtime.units import counted


@dataclass
class History:
    """Per-step and per-epoch metrics of a training run, plot-ready.

    ``steps`` has one row per logged optimizer step (step, epoch, loss, lr); ``epochs`` one
    row per finished epoch (epoch, steps, train_loss, validation metrics, seconds).
    ``table("epochs")`` gives the rows as columns, ready for a plotting library.
    ``stopped`` says why the run ended early (a callback, early stopping), or is None.
    """

    steps: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    device: str = ""
    precision: str = ""
    stopped: str | None = None

    def table(self, which: str = "epochs") -> dict[str, list[Any]]:
        """Column name -> values, for ``"epochs"`` or ``"steps"``."""
        rows = self.epochs if which == "epochs" else self.steps
        columns: dict[str, list[Any]] = {}
        for row in rows:
            for key in row:
                columns.setdefault(key, [])
        for row in rows:
            for key, values in columns.items():
                values.append(row.get(key))
        return columns

    def to_state(self) -> dict[str, Any]:
        """Plain data for a checkpoint, so a resumed run returns the whole history."""
        return {"steps": self.steps, "epochs": self.epochs, "stopped": self.stopped}

    def restore(self, state: dict[str, Any]) -> None:
        self.steps = list(state.get("steps", []))
        self.epochs = list(state.get("epochs", []))
        self.stopped = state.get("stopped")

    def _epoch_table(self) -> tuple[list[str], list[list[str]]]:
        columns = self.table("epochs")
        headers = list(columns)
        rows = [[_cell(values[index]) for values in columns.values()]
                for index in range(len(self.epochs))]
        return headers, rows

    def summary(self) -> str:
        last = self.steps[-1] if self.steps else {}
        stopped = f"; {self.stopped}" if self.stopped else ""
        return (f"History: {counted(len(self.epochs), 'epoch')}, "
                f"{counted(last.get('step', 0), 'step')} on "
                f"{self.device or 'n/a'} in {self.precision or 'n/a'}{stopped}")

    def __str__(self) -> str:
        headers, rows = self._epoch_table()
        return "\n".join([self.summary(), *(aligned_lines(headers, rows) if rows else [])])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        """The summary, the curves (loss, learning rate, validation metrics) and the table
        of epochs."""
        headers, rows = self._epoch_table()
        curves = TrainingCurves.of(self.steps, self.epochs)
        return (f"<p>{html.escape(self.summary())}</p>"
                + ("" if curves.empty() else curves.html())
                + (html_table((headers, rows)) if rows else ""))


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
