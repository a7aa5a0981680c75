"""Error text for people: one line, whatever the exception carried."""

from __future__ import annotations


def one_line(error: BaseException) -> str:
    """The exception's message with every run of whitespace (newlines too) made one space."""
    return " ".join(str(error).split()) or type(error).__name__


def describe_error(error: BaseException) -> str:
    """``Type: message`` on one line, for logs and notices that list failures."""
    return f"{type(error).__name__}: {one_line(error)}"
