"""Argument parsing shared by the magics: one clear line for every mistake."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.utils.process import arg_split

from ipycloud.runtime.units import parse_duration


def parse_line(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """Parse a magic's line; a mistake raises UsageError naming the magic and its help."""
    name = magic.__name__
    parser: argparse.ArgumentParser = magic.parser  # type: ignore[attr-defined]
    try:
        return parser.parse_args(_dash_values_attached(parser, arg_split(line, strict=True)))
    except (UsageError, ValueError) as error:  # ValueError: shlex on an unclosed quote
        raise UsageError(f"%{name}: {error} (see %{name}? for usage)") from None


def duration(text: str) -> float:
    """An argparse type: seconds from ``90``, ``90s``, ``10m``, ``1h30m`` or ``2d``."""
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def durations(text: str) -> tuple[float, ...]:
    """An argparse type: a comma-separated list of durations, such as ``15m,5m``."""
    return tuple(duration(part) for part in text.split(","))


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


def _dash_values_attached(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--every -5m`` as ``--every=-5m``: argparse takes a value that starts with a dash for
    an option unless it is attached, and would say "expected one argument" instead of what
    is wrong with the value."""
    options = parser._option_string_actions  # argparse keeps its option table private
    attached: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        action = options.get(token)
        takes_value = action is not None and action.nargs is None
        following = next(tokens, None) if takes_value else None
        if following is None:
            attached.append(token)
        elif following.startswith("-") and following not in options:
            attached.append(f"{token}={following}")
        else:
            attached += [token, following]
    return attached
