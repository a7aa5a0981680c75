"""The dashboard as text: one reading of the machine, for terminals and for kernels
without ipywidgets (``%dashboard --text``)."""

from __future__ import annotations

import time

from ipycloud.runtime.monitor.readings import DANGER_AT, WARNING_AT, readings
from ipycloud.runtime.monitor.samples import Sample
from ipycloud.runtime.tables import Table, aligned_lines

BAR_CHARS = 10
HEADERS = ("resource", "gauge", "use", "", "amount", "level", "detail")


def text_bar(percent: float | None) -> str:
    """A percentage as a bar of ten characters: ``[###       ]``."""
    filled = 0 if percent is None else round(min(max(percent, 0.0), 100.0) / 100 * BAR_CHARS)
    return "[" + "#" * filled + " " * (BAR_CHARS - filled) + "]"


def text_view(sample: Sample, live_hint: str = "ipycloud.live_dashboard()") -> str:
    """Every row of the dashboard for ``sample``, one line per gauge, as aligned text.

    ``live_hint`` names, in the front's own words, what shows the rows live.
    """
    headers, rows = resource_table(sample)
    clock = time.strftime("%H:%M:%S", time.localtime(sample.time))
    lines = [f"resources at {clock} (one reading; {live_hint} shows them live)",
             *aligned_lines(headers, rows)]
    if any(row[5] for row in rows):
        lines.append(f"level: warning from {WARNING_AT:.0f}% of a memory or disk limit, "
                     f"danger from {DANGER_AT:.0f}%")
    return "\n".join(lines)


def resource_table(sample: Sample) -> Table:
    """Every row of the dashboard for ``sample``, one row per gauge."""
    rows = []
    for reading in readings(sample):
        for position, gauge in enumerate(reading.gauges):
            rows.append((reading.label if position == 0 else "", gauge.name, gauge.percent_text,
                         text_bar(gauge.percent), gauge.amount, gauge.level,
                         reading.detail if position == 0 else ""))
    return HEADERS, rows
