"""File probes that answer instead of raising: for reading /proc, /sys and marker files."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """An ASCII file's text, or None when it is missing, unreadable or not text."""
    try:
        return path.read_text(encoding="ascii")
    except (OSError, ValueError):
        return None


def is_file(path: Path) -> bool:
    """Whether ``path`` is a regular file; False on any error."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    """Whether ``path`` is a folder; False on any error."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False
