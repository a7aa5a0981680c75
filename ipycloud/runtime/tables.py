"""Tables rendered two ways from one model: aligned text for terminals, HTML for notebooks."""

from __future__ import annotations

import html
from collections.abc import Sequence

# Column headers and rows of cells, every cell already formatted as text.
Table = tuple[Sequence[str], Sequence[Sequence[str]]]


def aligned_lines(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The header and rows as text lines, each column padded to its widest cell."""
    table = [headers, *rows]
    widths = [max(len(row[column]) for row in table) for column in range(len(headers))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in table]


def html_table(table: Table) -> str:
    """The table as an HTML ``<table>``, every cell escaped."""
    headers, rows = table
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def label_lines(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Label/value rows as text lines, the values aligned after the longest label."""
    width = max((len(label) for label, _ in pairs), default=0)
    return [f"{label.ljust(width)}  {value}" for label, value in pairs]


def html_pairs(pairs: Sequence[tuple[str, str]], css_class: str) -> str:
    """Label/value rows as an HTML ``<table>`` of class ``css_class``, every cell escaped."""
    body = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                   f"<td style='text-align:left'>{html.escape(value)}</td></tr>"
                   for label, value in pairs)
    return f"<table class='{css_class}'>{body}</table>"
