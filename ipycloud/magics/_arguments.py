"""Argument parsing shared by the magics: one clear line for every mistake."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring


def parse_line(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """Parse a magic's line; a mistake raises UsageError naming the magic and its help."""
    name = magic.__name__
    try:
        return parse_argstring(magic, line)
    except (UsageError, ValueError) as error:  # ValueError: shlex on an unclosed quote
        raise UsageError(f"%{name}: {error} (see %{name}? for usage)") from None
