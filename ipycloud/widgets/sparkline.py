"""Sparklines: the recent history of a row as a small inline SVG, cheap to redraw.

The picture is a function of the values only: each pixel column shows the peak of the
samples that fall in it, and runs of equal height collapse to their two ends, so a flat
trace over the whole window gives the same SVG tick after tick (and no widget message).
A Trace folds each sample into its column as it comes, the columns fixed in absolute
time, so it keeps at most a column's worth of figures per pixel and a redraw costs the
same for a 24-hour history as for a minute. No ipywidgets here: the dashboard puts the
string in a ``widgets.HTML``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from html import escape

WIDTH = 120
HEIGHT = 24
COLOURS = ("#1f77b4", "#ff7f0e")  # first series (utilisation, CPU) blue, second (memory) orange

Point = tuple[float, Sequence[float | None]]  # time.time() seconds, one value 0-100 per series


class Trace:
    """A row's history within the window (plus the column just before it), oldest first,
    as one point per pixel column: the time of the column's newest sample and the peak of
    each series over the column's samples."""

    def __init__(self, window: float, series: int, width: int = WIDTH) -> None:
        self.window = window
        self.series = series
        self.width = width
        self._column_s = window / width
        self._columns: deque[tuple[int, Point]] = deque()  # (column number, its point)

    def add(self, time: float, values: Sequence[float | None]) -> None:
        """Fold a sample into its column and forget the columns no longer needed."""
        column = math.floor(time / self._column_s)
        if self._columns and self._columns[-1][0] == column:
            peaks = self._columns[-1][1][1]
            values = [_peak(peak, value) for peak, value in zip(peaks, values, strict=True)]
            self._columns.pop()
        self._columns.append((column, (time, tuple(values))))
        start = time - self.window
        while len(self._columns) > 1 and self._columns[1][1][0] <= start:
            self._columns.popleft()

    def __len__(self) -> int:
        """How many points (columns) are kept."""
        return len(self._columns)

    def svg(self, title: str = "") -> str:
        """The sparkline of the window ending at the newest sample."""
        return sparkline_svg([point for _, point in self._columns], self.window, self.series,
                             title=title, width=self.width)


def sparkline_svg(points: Sequence[Point], window: float, series: int, *, title: str = "",
                  width: int = WIDTH, height: int = HEIGHT) -> str:
    """An SVG with one polyline per series over the ``window`` seconds ending at the last point.

    A point from before the window gives the value at its left edge.
    """
    start = points[-1][0] - window if points else 0.0
    lines = "".join(
        f'<polyline fill="none" stroke="{COLOURS[index % len(COLOURS)]}" stroke-width="1.5" '
        f'points="{polyline(points, index, start, window, width, height)}"/>'
        for index in range(series))
    caption = f"<title>{escape(title)}</title>" if title else ""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" style="background:#f3f3f3">{caption}{lines}</svg>')


def polyline(points: Sequence[Point], index: int, start: float, window: float, width: int,
             height: int) -> str:
    """The ``x,y`` pairs of series ``index``: the peak per pixel column, equal runs collapsed."""
    columns: dict[float, float] = {}
    for time, values in points:
        value = values[index]
        if value is None:
            continue
        x = 0.0 if time <= start else min(int((time - start) / window * width), width - 1) + 1.0
        columns[x] = value if time <= start else max(columns.get(x, value), value)
    heights = [(x, _y(value, height)) for x, value in columns.items()]
    kept = [point for position, point in enumerate(heights)
            if position in (0, len(heights) - 1)
            or not heights[position - 1][1] == point[1] == heights[position + 1][1]]
    return " ".join(f"{x:g},{y:g}" for x, y in kept)


def _y(value: float, height: int) -> float:
    """Height in the picture of a value 0-100 (SVG y grows downwards; a pixel of margin)."""
    clamped = min(max(value, 0.0), 100.0)
    return round(height - 1 - clamped / 100 * (height - 2), 1)


def _peak(a: float | None, b: float | None) -> float | None:
    """The larger of two figures, either of which may be unknown."""
    return b if a is None else a if b is None else max(a, b)
