"""The usage and cost report: its data, and its renderings as text, HTML, JSON and CSV."""

from __future__ import annotations

import csv
import html
import io
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.durable import refuse_a_file, write_bytes_atomically
from ipycloud.runtime.monitor.prices import Cost
from ipycloud.runtime.tables import Table, aligned_lines, html_pairs, html_table, label_lines
from ipycloud.runtime.units import NA, format_bytes, format_duration, format_of, format_percent


@dataclass(frozen=True)
class GpuUsage:
    """One GPU over the session; percentages 0-100, memory in bytes, times in seconds."""

    index: int
    name: str
    kind: str | None  # the price table's GPU kind, e.g. "A100 80GB"
    seconds: float  # counted time this GPU was in the samples
    utilization_average: float | None
    utilization_peak: float | None
    idle_seconds: float | None  # utilisation below the threshold; None when never known
    idle_share: float | None  # of the time utilisation was known, 0-1
    memory_average: int | None
    memory_peak: int | None
    memory_total: int | None
    memory_average_percent: float | None
    memory_peak_percent: float | None


@dataclass(frozen=True)
class UsageReport:
    """The usage and cost report: text (``str``), HTML, a dict, JSON or a CSV file.

    Times are seconds, memory bytes, percentages 0-100, shares 0-1, money US dollars.
    """

    started: float  # time.time() of the first sample
    ended: float  # the newest sample's time plus the time it counts for
    duration_s: float  # the time counted
    uncounted_s: float  # the part of ended - started in gaps beyond the cap
    samples: int
    gpu_count: int  # the most GPUs in one sample
    gpu_hours: float
    idle_below_percent: float
    cpu_average_percent: float | None
    cpu_peak_percent: float | None
    ram_average: int | None
    ram_peak: int | None
    ram_limit: int  # when RAM use peaked
    gpus: tuple[GpuUsage, ...]
    cost: Cost | None  # this run on its instance; None when the instance is not known
    cost_basis: str  # how the instance was told, or why it could not be
    comparison_rule: str
    comparison: tuple[Cost, ...]  # the same time on other instances, cheapest first
    prices_about: str
    # How the reader names an instance to price the run as: this parameter in Python, a
    # front's own option (``--instance KEY``) where it shows the report.
    instance_option: str = field(default="instance=", repr=False)

    @property
    def ram_peak_percent(self) -> float | None:
        """The RAM peak as a percentage of the limit at that moment."""
        return fraction(self.ram_peak, self.ram_limit)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data; the keys are the field names above (but
        ``instance_option``)."""
        data = _plain(asdict(self))
        del data["instance_option"]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write the report as CSV rows of section, item, field, value (sections: session,
        gpu by index, cost and compare by instance), whole or not at all; returns the path.
        A file there is replaced; a folder, device or pipe is not."""
        target = Path(path)
        try:
            refuse_a_file(target.parent)
        except NotADirectoryError as error:
            raise NotADirectoryError(f"cannot write {target}: {error}") from None
        if not target.parent.is_dir():
            raise FileNotFoundError(f"cannot write {target}: the folder {target.parent} "
                                    f"does not exist")
        if target.exists() and not target.is_file():
            raise FileExistsError(f"cannot write {target}: it is a folder, a device or a pipe, "
                                  "not a file")
        write_bytes_atomically(target, csv_text(self).encode("utf-8"))
        return target

    def __str__(self) -> str:
        return text(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return html_report(self)


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
        ("RAM", f"peak {format_of(report.ram_peak, report.ram_limit)} "
                f"({format_percent(report.ram_peak_percent)}), "
                f"average {format_bytes(report.ram_average)}"),
        ("Instance", f"{cost.instance} ({report.cost_basis})" if cost else
         f"not known: {report.cost_basis}; pass {report.instance_option} with a key of the "
         "price table"),
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


def _plain(value: Any) -> Any:
    """asdict's output with tuples as lists, as JSON gives them back."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def fraction(part: float | None, whole: int | None) -> float | None:
    """``part`` as a percentage of ``whole``; None when either is unknown or zero."""
    return None if part is None or not whole else 100 * part / whole
