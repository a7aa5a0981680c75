"""Small rich results for magics that report what they did."""

from __future__ import annotations

from typing import Any


class Notice:
    """A one-line message a magic returns: shown as plain text, without quotes."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)
