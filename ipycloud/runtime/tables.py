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
