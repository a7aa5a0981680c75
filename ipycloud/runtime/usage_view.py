"""The usage report rendered: aligned text, HTML and CSV from one UsageReport."""

from __future__ import annotations

import csv
import html
import io
import time
from typing import TYPE_CHECKING

from ipycloud.runtime.tables import Table, aligned_lines, html_pairs, html_table, label_lines
from ipycloud.runtime.units import NA, format_bytes, format_duration, format_percent

if TYPE_CHECKING:
    from ipycloud.runtime.prices import Cost
    from ipycloud.runtime.usage import UsageReport

CSV_HEADER = ("section", "item", "field", "value")


def summary(report: UsageReport) -> list[tuple[str, str]]:
    """The label/value rows above the tables."""
    gaps = (f"; {format_duration(report.uncounted_s)} of gaps not counted"
            if report.uncounted_s >= 1 else "")
    cost = report.cost
    return [
        ("Session", f"{_clock(report.started)} to {_clock(report.ended)}: "
                    f"{format_duration(report.duration_s)} counted from {report.samples} "
                    f"samples{gaps}"),
        ("GPU-hours", f"{report.gpu_hours:.2f} ({report.gpu_count} GPU"
                      f"{'' if report.gpu_count == 1 else 's'})"),
        ("CPU", f"average {format_percent(report.cpu_average_percent)}, "
                f"peak {format_percent(report.cpu_peak_percent)}"),
        ("RAM", f"peak {format_bytes(report.ram_peak)} of {format_bytes(report.ram_limit)} "
                f"({format_percent(report.ram_peak_percent)}), "
                f"average {format_bytes(report.ram_average)}"),
        ("Instance", f"{cost.instance} ({report.cost_basis})" if cost else
         f"not known: {report.cost_basis}; pass instance= with a key of the price table"),
        ("Estimated cost", _cost_text(cost) if cost else NA),
    ]


def gpu_table(report: UsageReport) -> Table:
    """Headers and one row per GPU."""
    headers = ("GPU", "Name", "Time", "Util avg", "Util peak",
               f"Idle (<{report.idle_below_percent:g}%)", "Memory avg", "Memory peak",
               "Memory total")
    rows = [(str(gpu.index), gpu.name, format_duration(gpu.seconds),
             format_percent(gpu.utilization_average), format_percent(gpu.utilization_peak),
             NA if gpu.idle_seconds is None else f"{format_duration(gpu.idle_seconds)} "
             f"({format_percent(None if gpu.idle_share is None else 100 * gpu.idle_share)})",
             f"{format_bytes(gpu.memory_average)} ({format_percent(gpu.memory_average_percent)})",
             f"{format_bytes(gpu.memory_peak)} ({format_percent(gpu.memory_peak_percent)})",
             format_bytes(gpu.memory_total)) for gpu in report.gpus]
    return headers, rows


def comparison_table(report: UsageReport) -> Table:
    """Headers and one row per instance compared, cheapest first."""
    headers = ("Instance", "GPUs", "$/hour", "Cost", "As of", "Source")
    rows = [(cost.instance, f"{cost.gpus} x {cost.gpu}", _usd(cost.usd_per_hour),
             _usd(cost.cost_usd) + ("" if cost.compute_units is None
                                    else f" ({cost.compute_units:.2f} units)"),
             cost.as_of or NA, cost.source) for cost in report.comparison]
    return headers, rows


def text(report: UsageReport) -> str:
    """The report as aligned text."""
    lines = label_lines(summary(report))
    for title, (headers, table_rows) in _tables(report):
        lines += ["", title, *aligned_lines(headers, table_rows)]
    return "\n".join([*lines, "", *_notes(report)])


def html_report(report: UsageReport) -> str:
    """The report as HTML."""
    parts = [html_pairs(summary(report), "ipycloud-usage")]
    parts += [f"<h4>{html.escape(title)}</h4>{html_table(table)}"
              for title, table in _tables(report)]
    parts += [f"<p><small>{html.escape(note)}</small></p>" for note in _notes(report)]
    return "<div class='ipycloud'>" + "".join(parts) + "</div>"


def csv_text(report: UsageReport) -> str:
    """The report's data as CSV: a row per field of the session, of each GPU (item: its
    index), of the cost and of each instance compared (item: the instance); empty for None."""
    data = report.to_dict()
    rows = [("session", "", name, value) for name, value in data.items()
            if name not in ("gpus", "cost", "comparison")]
    rows += [("gpu", str(gpu["index"]), name, value)
             for gpu in data["gpus"] for name, value in gpu.items()]
    costs = [("cost", data["cost"])] if data["cost"] else []
    costs += [("compare", cost) for cost in data["comparison"]]
    rows += [(section, cost["instance"], name, value)
             for section, cost in costs for name, value in cost.items()]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_HEADER)
    writer.writerows((section, item, name, "" if value is None else value)
                     for section, item, name, value in rows)
    return out.getvalue()


def _tables(report: UsageReport) -> list[tuple[str, Table]]:
    tables = [("GPUs", gpu_table(report))] if report.gpus else []
    if report.comparison:
        tables.append((f"The same {format_duration(report.duration_s)} on "
                       f"{report.comparison_rule}, cheapest first", comparison_table(report)))
    return tables


def _notes(report: UsageReport) -> list[str]:
    notes = [] if report.comparison else [f"No comparison: {report.comparison_rule}."]
    return [*notes, f"Prices: {report.prices_about}"]


def _cost_text(cost: Cost) -> str:
    """The cost with how it was reckoned and where the rate comes from."""
    rate = (f"{_usd(cost.usd_per_hour)}/hour" if cost.units_per_hour is None else
            f"{cost.units_per_hour:g} Colab compute units/hour, "
            f"{cost.compute_units or 0:.2f} units in all")
    checked = "" if cost.verified else ", not verified"
    note = f"; {cost.note}" if cost.note else ""
    return (f"{_usd(cost.cost_usd)} for {format_duration(cost.hours * 3600)} at {rate} "
            f"(rate as of {cost.as_of or 'an unknown date'}{checked}: {cost.source}{note})")


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _usd(value: float) -> str:
    return f"${value:,.2f}" if value >= 1 or value == 0 else f"${value:.3f}"
