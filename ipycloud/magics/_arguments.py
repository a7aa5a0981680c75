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


def refuse_options(magic: Callable[..., Any], args: argparse.Namespace, allowed: set[str],
                   where: str) -> None:
    """UsageError naming the first option given that does not apply to ``where``.

    Every parsed name other than the positional ``action`` and ``operands`` is an option;
    one left at its default (None or False) counts as not given.
    """
    name = magic.__name__
    for option, value in vars(args).items():
        if option in ("action", "operands") or value in (None, False) or option in allowed:
            continue
        flag = "--" + option.replace("_", "-")
        raise UsageError(f"%{name}: {flag} does not apply to {where} (see %{name}? for usage)")
