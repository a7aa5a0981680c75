"""The curves of a training run: loss (raw and smoothed), learning rate and validation metrics
against the optimizer step, gathered row by row and drawn as inline SVG charts.

The smoothed loss is TensorBoard's: an exponential moving average of the logged rows with
weight ``SMOOTHING``, debiased (divided by ``1 - SMOOTHING ** n`` after ``n`` rows) so it
starts at the first value instead of at zero; non-finite values are left out of it.
Each line keeps at most ``MAX_POINTS`` points: past that it keeps every other one (and
then every fourth...), so a redraw costs the same at step ten million as at step ten.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ipycloud.runtime.charts import Series, charts_html, line_chart

SMOOTHING = 0.9
MAX_POINTS = 400
LOSS, VAL_LOSS, LEARNING_RATE = "#1f77b4", "#ff7f0e", "#2ca02c"
METRIC_COLOURS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


class Line:
    """The points of one line, thinned to at most ``capacity``; the newest always kept."""

    def __init__(self, capacity: int = MAX_POINTS) -> None:
        self.capacity = capacity
        self.stride = 1  # one point kept for every ``stride`` added
        self.points: list[tuple[float, float]] = []
        self.newest: tuple[float, float] | None = None
        self._added = 0

    def add(self, x: float, y: float) -> None:
        self.newest = (x, y)
        if self._added % self.stride == 0:
            self.points.append((x, y))
            if len(self.points) > self.capacity:
                self.points = self.points[::2]
                self.stride *= 2
        self._added += 1

    def drawn(self) -> list[tuple[float, float]]:
        """The kept points and the newest one."""
        if self.newest is None or (self.points and self.points[-1] == self.newest):
            return list(self.points)
        return [*self.points, self.newest]


class Smoother:
    """TensorBoard's debiased exponential moving average (see the module's docstring)."""

    def __init__(self, weight: float = SMOOTHING) -> None:
        self.weight = weight
        self._average = 0.0
        self._count = 0

    def add(self, value: float) -> float | None:
        """The smoothed value after ``value``; None while no finite value has come."""
        if math.isfinite(value):
            self._average = self.weight * self._average + (1 - self.weight) * value
            self._count += 1
        if not self._count:
            return None
        return self._average / (1 - self.weight ** self._count)


class TrainingCurves:
    """A run's curves, fed with ``fit``'s logged rows and epoch logs."""

    def __init__(self) -> None:
        self.loss, self.smoothed, self.lr = Line(), Line(), Line()
        self.metrics: dict[str, Line] = {}  # val_* -> its line, one point per epoch
        self._smoother = Smoother()

    @classmethod
    def of(cls, steps: Iterable[Mapping[str, Any]],
           epochs: Iterable[Mapping[str, Any]]) -> TrainingCurves:
        """The curves of a whole history (``History.steps`` and ``History.epochs``)."""
        curves = cls()
        for row in steps:
            curves.add_step(row)
        for logs in epochs:
            curves.add_epoch(logs)
        return curves

    def add_step(self, row: Mapping[str, Any]) -> None:
        """A logged row: ``step``, ``loss`` (the mean since the last row), ``lr``."""
        step, loss, lr = row.get("step"), row.get("loss"), row.get("lr")
        if not isinstance(step, int | float):
            return
        if isinstance(loss, int | float):
            self.loss.add(step, loss)
            smoothed = self._smoother.add(loss)
            if smoothed is not None:
                self.smoothed.add(step, smoothed)
        if isinstance(lr, int | float):
            self.lr.add(step, lr)

    def add_epoch(self, logs: Mapping[str, Any]) -> None:
        """An epoch's logs: each ``val_*`` figure at the step the epoch ended (``steps``)."""
        step = logs.get("steps")
        if not isinstance(step, int | float):
            return
        for key, value in logs.items():
            if key.startswith("val_") and isinstance(value, int | float):
                self.metrics.setdefault(key, Line()).add(step, value)

    def empty(self) -> bool:
        return self.loss.newest is None and not self.metrics

    def charts(self) -> list[str]:
        """One SVG per chart: the loss (with ``val_loss``), the learning rate, each other
        validation metric."""
        loss = [Series("loss", self.loss.drawn(), LOSS, opacity=0.35),
                Series(f"smoothed ({SMOOTHING:g})", self.smoothed.drawn(), LOSS)]
        if "val_loss" in self.metrics:
            loss.append(Series("val_loss", self.metrics["val_loss"].drawn(), VAL_LOSS,
                               markers=True))
        others = [line_chart(name, [Series(name, line.drawn(),
                                           METRIC_COLOURS[index % len(METRIC_COLOURS)],
                                           markers=True)])
                  for index, (name, line) in enumerate(sorted(
                      (name, line) for name, line in self.metrics.items() if name != "val_loss"))]
        charts = [line_chart("loss", loss)]
        if self.lr.newest is not None:
            charts.append(line_chart("learning rate", [Series("lr", self.lr.drawn(),
                                                                LEARNING_RATE)]))
        return charts + others

    def html(self, caption: str = "") -> str:
        """The charts side by side under ``caption``, as an HTML fragment."""
        return charts_html(self.charts(), caption)
