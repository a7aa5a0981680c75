"""Line charts as inline SVG text: axes with nice ticks, a legend with each series' last value.

Pure Python and self-contained, so a notebook, a saved page or a static snapshot shows
them with nothing installed. Points whose value is NaN or infinite are left out and break
the line; a single point or a constant series gets a small range around its value; the
y axis is logarithmic where asked, or (``log_y=None``) where every value is positive and
they span at least a decade.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 340, 210
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 40, 34  # margins around the plot area
TICKS = 5  # about how many ticks an axis gets
FONT = "font-family:sans-serif;font-size:11px"


@dataclass(frozen=True)
class Series:
    """A line of (x, y) points; ``markers`` draws a dot at every point (e.g. one per epoch)."""

    label: str
    points: Sequence[tuple[float, float]]
    colour: str
    opacity: float = 1.0
    markers: bool = False


@dataclass(frozen=True)
class Axis:
    """Where an axis runs (its ends, in data units; log10 of them on a log axis) and its ticks."""

    low: float
    high: float
    ticks: list[float]  # in data units
    log: bool = False

    def mapping(self, start: float, end: float) -> Callable[[float], float]:
        """The picture coordinate of a value on a line from ``start`` to ``end``."""
        scale, low = (end - start) / (self.high - self.low), self.low
        if self.log:
            return lambda value: start + (math.log10(value) - low) * scale
        return lambda value: start + (value - low) * scale


def line_chart(title: str, series: Sequence[Series], *, x_label: str = "step",
               log_y: bool | None = None, width: int = WIDTH, height: int = HEIGHT) -> str:
    """One chart of ``series`` against a shared x axis, as an ``<svg>`` element."""
    finite = [(x, y) for line in series for x, y in line.points
              if math.isfinite(x) and math.isfinite(y)]
    xs, ys = [x for x, _ in finite], [y for _, y in finite]
    right, bottom = width - RIGHT, height - BOTTOM
    parts = [f'<rect width="{width}" height="{height}" fill="#fff"/>',
             f'<text x="8" y="15" style="font-weight:bold">{escape(title)}</text>',
             _legend(series)]
    if xs:
        x_axis = linear_axis(min(xs), max(xs), extend=False,
                             whole=all(float(x).is_integer() for x in xs))
        use_log = _wants_log(ys) if log_y is None else log_y and min(ys) > 0
        y_axis = log_axis(min(ys), max(ys)) if use_log else linear_axis(min(ys), max(ys))
        parts += [_grid(x_axis, y_axis, right, bottom),
                  _frame(right, bottom, x_label, width, height)]
        parts += [_line(line, x_axis, y_axis, right, bottom) for line in series]
    else:
        parts.append(f'<text x="{width / 2:g}" y="{height / 2:g}" text-anchor="middle" '
                     f'fill="#888">no data yet</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" style="{FONT}" role="img" '
            f'aria-label="{escape(title)}"><title>{escape(title)}</title>{"".join(parts)}</svg>')


def charts_html(charts: Iterable[str], caption: str = "") -> str:
    """Charts side by side, wrapping to the width of the page, under an optional caption."""
    line = f'<div style="{FONT};color:#444;margin:2px 0">{escape(caption)}</div>' \
        if caption else ""
    return (f'<div class="ipycloud-curves">{line}<div style="display:flex;flex-wrap:wrap;'
            f'gap:8px">{"".join(charts)}</div></div>')


def format_value(value: float) -> str:
    """A figure as a legend shows it: four significant digits, nan and inf as such."""
    return f"{value:.4g}"


# -- axes ---------------------------------------------------------------------------------------


def linear_axis(low: float, high: float, extend: bool = True, whole: bool = False) -> Axis:
    """An axis over ``low``..``high`` with ticks at 1, 2 or 5 times a power of ten (whole
    numbers only when ``whole``); its ends move out to the nearest ticks when ``extend``.
    An empty range is widened around it."""
    if low == high:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    step = nice_step((high - low) / TICKS)
    if whole:
        step = max(step, 1.0)
    if extend:
        low, high = math.floor(low / step) * step, math.ceil(high / step) * step
    first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
    ticks = [_snap(index * step, step) for index in range(first, last + 1)]
    return Axis(low, high, ticks)


def log_axis(low: float, high: float) -> Axis:
    """A log10 axis over ``low``..``high``: ticks at the powers of ten, and at 2 and 5 times
    them over two decades or less, the ends moved out to the nearest ticks."""
    bottom, top = math.floor(math.log10(low)), math.ceil(math.log10(high))
    multiples = (1, 2, 5) if top - bottom <= 2 else (1,)
    candidates = [_snap(multiple * 10.0 ** power, 10.0 ** power)
                  for power in range(bottom, top + 1) for multiple in multiples]
    below = max(tick for tick in candidates if tick <= low)
    above = min(tick for tick in candidates if tick >= high)
    if below == above:  # a constant series on a power of ten
        below, above = below / 10, above * 10
        candidates = [below, *candidates, above]
    ticks = [tick for tick in candidates if below <= tick <= above]
    return Axis(math.log10(below), math.log10(above), ticks, log=True)


def nice_step(rough: float) -> float:
    """The figure nearest ``rough`` among 1, 2 and 5 times a power of ten."""
    power = 10.0 ** math.floor(math.log10(rough))
    share = rough / power
    multiple = 1 if share < 1.5 else 2 if share < 3.5 else 5 if share < 7.5 else 10
    return multiple * power


def tick_label(value: float) -> str:
    """A tick's figure, short: 0.001, 2e-05, 1500, 1.2e+06."""
    return f"{value:.6g}"


def _snap(value: float, step: float) -> float:
    """``value`` rounded to the digits ``step`` has, so 3 * 0.1 reads 0.3."""
    digits = max(0, 1 - math.floor(math.log10(step)))
    return round(value, digits + 6)


def _wants_log(values: Sequence[float]) -> bool:
    return bool(values) and min(values) > 0 and max(values) >= 10 * min(values)


# -- drawing ------------------------------------------------------------------------------------


def _grid(x_axis: Axis, y_axis: Axis, right: int, bottom: int) -> str:
    x_of, y_of = x_axis.mapping(LEFT, right), y_axis.mapping(bottom, TOP)
    lines, x_labels, y_labels = [], [], []
    for tick in x_axis.ticks:
        x = x_of(tick)
        lines.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{bottom}"/>')
        x_labels.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">'
                        f'{tick_label(tick)}</text>')
    for tick in y_axis.ticks:
        y = y_of(tick)
        lines.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
        y_labels.append(f'<text x="{LEFT - 5}" y="{y + 4:.1f}" text-anchor="end">'
                        f'{tick_label(tick)}</text>')
    return (f'<g class="grid" stroke="#e6e6e6">{"".join(lines)}</g>'
            f'<g class="x-ticks" fill="#555">{"".join(x_labels)}</g>'
            f'<g class="y-ticks" fill="#555" data-scale="{"log" if y_axis.log else "linear"}">'
            f'{"".join(y_labels)}</g>')


def _frame(right: int, bottom: int, x_label: str, width: int, height: int) -> str:
    return (f'<g class="axes" stroke="#888"><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" '
            f'y2="{bottom}"/><line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}"/></g>'
            f'<text class="x-label" x="{width - RIGHT}" y="{height - 4}" text-anchor="end" '
            f'fill="#555">{escape(x_label)}</text>')


def _line(line: Series, x_axis: Axis, y_axis: Axis, right: int, bottom: int) -> str:
    """The series as polylines (one per run of finite points) and dots: at its last finite
    point, at a point alone between non-finite ones, and at every point with ``markers``."""
    x_of, y_of = x_axis.mapping(LEFT, right), y_axis.mapping(bottom, TOP)
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in line.points:
        if math.isfinite(x) and math.isfinite(y):
            runs[-1].append((x_of(x), y_of(y)))
        elif runs[-1]:
            runs.append([])
    style = (f'fill="none" stroke="{line.colour}" stroke-width="1.5" '
             f'stroke-opacity="{line.opacity:g}"')
    shapes = [f'<polyline {style} points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in run)}"/>'
              for run in runs if len(run) > 1]
    finite = [point for run in runs for point in run]
    alone = [run[0] for run in runs if len(run) == 1]
    dots = finite if line.markers else list(dict.fromkeys([*alone, *finite[-1:]]))
    shapes += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{line.colour}"/>'
               for x, y in dots]
    return f'<g class="series" data-label="{escape(line.label)}">{"".join(shapes)}</g>'


def _legend(series: Sequence[Series]) -> str:
    """Each series' swatch, label and last value, on one line under the title."""
    entries, x = [], 8
    for line in series:
        last = format_value(line.points[-1][1]) if line.points else "n/a"
        text = f"{line.label} {last}"
        entries.append(f'<rect x="{x}" y="23" width="10" height="3" fill="{line.colour}" '
                       f'fill-opacity="{max(line.opacity, 0.5):g}"/>'
                       f'<text x="{x + 13}" y="28" data-last="{escape(last)}">'
                       f'{escape(text)}</text>')
        x += 13 + 6 * len(text) + 10
    return f'<g class="legend" fill="#333">{"".join(entries)}</g>'
