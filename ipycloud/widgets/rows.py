"""One row of the dashboard as widgets, and the only code that writes their traits.

Traits are written only when their value changes, so an idle machine sends the frontend
nothing; a widget with several changes sends them as one message.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ipycloud.runtime.monitor.readings import Reading
from ipycloud.widgets.sparkline import WIDTH

LABEL_WIDTH = "7.5em"
BAR_WIDTH = "16em"
SPARKLINE_WIDTH = f"{WIDTH + 12}px"
# Holds the longest RAM text, "100% · 4095.9 GiB of 4095.9 GiB", so the columns line up; a
# longer label or text (a disk's) widens its own row rather than being cut.
TEXT_WIDTH = "19em"


def set_changed(widget: Any, **values: Any) -> None:
    """Set the traits whose value differs, as one message."""
    changed = {name: value for name, value in values.items() if getattr(widget, name) != value}
    if changed:
        with widget.hold_sync():
            for name, value in changed.items():
                setattr(widget, name, value)


class RowWidgets:
    """The label, one bar and text per gauge, the detail and the sparkline of one reading."""

    def __init__(self, reading: Reading) -> None:
        self.label = widgets.Label(reading.label, layout=_at_least(LABEL_WIDTH))
        self.bars = [widgets.FloatProgress(min=0.0, max=100.0, description=gauge.name,
                                           style={"description_width": "4em"},
                                           layout=_fixed(BAR_WIDTH))
                     for gauge in reading.gauges]
        self.texts = [widgets.Label(layout=_at_least(TEXT_WIDTH)) for _ in reading.gauges]
        self.sparkline = widgets.HTML(layout=_fixed(SPARKLINE_WIDTH)) if reading.traced else None
        self.detail = widgets.Label()
        parts: list[Any] = [self.label]
        for bar, text in zip(self.bars, self.texts, strict=True):
            parts += [bar, text]
        parts += [self.sparkline or widgets.Box(layout=_fixed(SPARKLINE_WIDTH)),  # details align
                  self.detail]
        self.box = widgets.HBox(parts)
        self.show(reading)

    def show(self, reading: Reading, sparkline: str | None = None) -> None:
        """Show ``reading``, and the sparkline's SVG when given."""
        for bar, text, gauge in zip(self.bars, self.texts, reading.gauges, strict=True):
            set_changed(bar, value=gauge.rounded, bar_style=gauge.level)
            set_changed(text, value=gauge.text)
        set_changed(self.detail, value=reading.detail)
        if self.sparkline is not None and sparkline is not None:
            set_changed(self.sparkline, value=sparkline)


def _fixed(width: str) -> Any:
    """A layout of this width that a long detail beside it does not squeeze."""
    return widgets.Layout(width=width, flex="0 0 auto")


def _at_least(width: str) -> Any:
    """A layout of at least this width, wider for a longer text, never squeezed."""
    return widgets.Layout(min_width=width, flex="0 0 auto")
