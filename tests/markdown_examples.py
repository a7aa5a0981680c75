"""The Python examples of the documentation (docs/**/*.md and README.md): each ```python
block, in page order, and the ones marked not to run, with the reason the page shows.

A block is kept from the suite by an HTML comment on the line just above its fence, which
a reviewer reads beside it: ``<!-- no-run: the reason -->``."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^\s*(?P<ticks>`{3,})(?P<info>[^`]*)$")
NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    """One ```python block: where it starts, its code, and why it is not run (or None)."""

    page: str
    line: int
    code: str
    not_run: str | None


def pages() -> list[Path]:
    """README.md and every page of the site, in a fixed order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples(page: Path) -> list[Example]:
    """The ```python blocks of ``page``, dedented as they sit in a list item."""
    lines = page.read_text(encoding="utf-8").splitlines()
    name = page.relative_to(ROOT).as_posix()
    found: list[Example] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != opening["ticks"]:
            end += 1
        if opening["info"].strip().split(" ")[0] == "python":
            above = lines[index - 1] if index else ""
            marked = NO_RUN.match(above)
            found.append(Example(name, index + 1,
                                 textwrap.dedent("\n".join(lines[index + 1:end])),
                                 marked["reason"] if marked else None))
        index = end + 1
    return found
