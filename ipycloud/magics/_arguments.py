"""Argument parsing shared by the magics: words split as a POSIX shell splits them, ``-h``
for help, and one clear line for every mistake.

IPython expands ``$name`` and ``{expression}`` in the line before the magic sees it, so
``--dir "$folder"`` gives a folder whose name holds spaces as one word.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from IPython.core.error import UsageError

from ipycloud.runtime.units import format_seconds, parse_duration, parse_size

Magic = Callable[..., Any]
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")  # argparse's own test for a negative number
_SHELL_BLANKS = " \t\r\n"  # what separates words, as shlex's POSIX mode reads them


def parse_line(magic: Magic, line: str) -> argparse.Namespace:
    """Parse a magic's line; a mistake raises UsageError naming the magic and its help.

    The line is split like a shell command line: quotes group words and are removed, a
    backslash escapes the next character, a ``#`` that starts a word begins a comment that
    runs to the end of the line. Options are never abbreviated (``--jso`` is not
    ``--json``); an empty word (``--dir ""``) and an option given twice are refused.
    """
    name = magic.__name__
    parser: argparse.ArgumentParser = magic.parser  # type: ignore[attr-defined]
    parser.allow_abbrev = False  # read by argparse at each parse
    try:
        return parser.parse_args(_prepared(parser, _words(line)))
    except (UsageError, ValueError) as error:
        shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(error))
        raise UsageError(f"%{name}: {shown} (see %{name}? for usage)") from None


def help_option(magic: Magic) -> Magic:
    """Give a magic ``-h``/``--help``, which prints its help page and runs nothing.

    Goes above ``@magic_arguments()``: it adds the option to the parser built there and to
    the help page (the docstring), and answers the request the parser raises.
    """
    parser: argparse.ArgumentParser = magic.parser  # type: ignore[attr-defined]
    parser.add_argument("-h", "--help", action=_ShowHelp,
                        help="show this help page and do nothing else")
    magic.__doc__ = parser.format_help()

    @functools.wraps(magic)
    def answering_help(self: Any, line: str = "") -> Any:
        try:
            return magic(self, line)
        except _HelpRequested as request:
            print(request.page)
            return None

    return answering_help


def duration(text: str) -> float:
    """An argparse type: seconds from ``90``, ``90s``, ``10m``, ``1h30m`` or ``2d``."""
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def size(text: str) -> int:
    """An argparse type: bytes from ``5000``, ``500M``, ``20GiB`` or ``2TB``."""
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def durations(text: str) -> tuple[float, ...]:
    """An argparse type: a comma-separated list of different durations, such as ``15m,5m``."""
    values = tuple(duration(part) for part in text.split(","))
    for index, value in enumerate(values):
        if value in values[:index]:
            raise argparse.ArgumentTypeError(
                f"{format_seconds(value)} is given twice in {text!r}: give each once")
    return values


def user_path(text: str) -> str:
    """An argparse type: a path, its leading ``~`` or ``~user`` expanded (``expand_home``)."""
    try:
        return expand_home(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def expand_home(text: str) -> str:
    """``text`` with a leading ``~`` or ``~user`` made that home folder, as a shell does;
    ValueError (one line) for a user this machine does not know, rather than a folder named
    after them."""
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        head = text.split("/", 1)[0]
        user = f"no user named {head[1:]!r}" if head != "~" else "no home folder known"
        raise ValueError(f"{user} for {head}: give the full path")
    return expanded


def refuse_options(magic: Magic, args: argparse.Namespace, allowed: set[str],
                   where: str) -> None:
    """UsageError naming the first option given that does not apply to ``where``.

    ``allowed`` holds the destinations of the options that apply; an option whose value is
    its default counts as not given.
    """
    name = magic.__name__
    parser: argparse.ArgumentParser = magic.parser  # type: ignore[attr-defined]
    for action in parser._actions:  # argparse keeps its option table private
        if (not action.option_strings or action.dest in allowed
                or getattr(args, action.dest, action.default) == action.default):
            continue
        flag = max(action.option_strings, key=len)
        raise UsageError(f"%{name}: {flag} does not apply to {where} (see %{name}? for usage)")


class _HelpRequested(Exception):
    """``-h`` or ``--help`` was given: carries the help page to show instead of running."""

    def __init__(self, page: str) -> None:
        super().__init__(page)
        self.page = page


class _ShowHelp(argparse.Action):
    """``-h``/``--help`` for a magic: argparse's own help action would exit the kernel."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        # The page is written for %name? in reStructuredText: drop its literal-block marker.
        raise _HelpRequested("usage: " + parser.format_help().removeprefix("::").lstrip())


def _words(line: str) -> list[str]:
    """The line split as a POSIX shell splits it; ValueError (one line) when it cannot be."""
    try:
        return shlex.split(_without_comment(line))
    except ValueError as error:
        if str(error) == "No escaped character":  # shlex's words for a backslash at the end
            raise ValueError("a backslash at the end of the line escapes nothing") from None
        raise  # "No closing quotation"


def _without_comment(line: str) -> str:
    """The line up to a ``#`` that starts a word outside quotes, where a shell's comment
    starts (``%gpuinfo  # what did I get?``); a ``#`` inside a word (``run#3``), in quotes
    or after a backslash is kept."""
    quote = ""
    escaped = False
    word_starts = True
    for index, char in enumerate(line):
        if escaped:
            escaped, word_starts = False, False
            continue
        if char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and word_starts:
            return line[:index]
        word_starts = not quote and char in _SHELL_BLANKS
    return line


def _prepared(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """The words as argparse should see them; empty ones and options given twice refused
    (argparse would keep the last value without a word).

    An option's value that starts with a dash is attached (``--every -5m`` as
    ``--every=-5m``): argparse takes such a value for an option unless it is attached, and
    would say "expected one argument" instead of what is wrong with the value. A word that
    looks like an option the magic does not have is refused by its name ("unknown option
    --evry"), before argparse would take the word after it for an operand.
    """
    options = parser._option_string_actions  # argparse keeps its option table private
    prepared: list[str] = []
    given: set[argparse.Action] = set()
    tokens = iter(words)
    for token in tokens:
        if token == "--":  # what follows is operands, as argparse reads them
            prepared += [token, *tokens]
            break
        flag, attached, value = token.partition("=")
        if _is_unknown_option(token, options):  # named as typed; unprintable, as Python's repr
            raise ValueError(f"unknown option {flag if flag.isprintable() else repr(flag)}")
        if token == "" or (attached and not value and flag in options):
            raise ValueError(_empty(flag if attached else None))
        for option in _options_in(token, options):
            if option in given:
                raise ValueError(f"argument {'/'.join(option.option_strings)}: given twice: "
                                 "give it once")
            given.add(option)
        action = options.get(token)
        takes_value = action is not None and action.nargs is None
        following = next(tokens, None) if takes_value else None
        if following is None:
            prepared.append(token)
        elif following == "":
            raise ValueError(_empty(token))
        elif following.startswith("-") and following not in options:
            prepared.append(f"{token}={following}")
        else:
            prepared += [token, following]
    return prepared


def _is_unknown_option(token: str, options: dict[str, argparse.Action]) -> bool:
    """Whether ``token`` is written as an option (``--name``, ``-x``) that the magic does
    not have; a negative number and a lone ``-`` are operands, as argparse reads them."""
    if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.fullmatch(token):
        return False
    if token.partition("=")[0] in options:
        return False
    if token.startswith("--"):
        return True
    first = options.get(token[:2])
    if first is not None and first.nargs != 0:
        return False  # -n5: a short option and its value
    return not all(options.get(f"-{letter}") is not None and options[f"-{letter}"].nargs == 0
                   for letter in token[1:])  # -pq: flags run together


def _options_in(token: str, options: dict[str, argparse.Action]) -> list[argparse.Action]:
    """The options a word gives: ``--name``, ``--name=value``, or flags run together
    (``-pq`` for ``-p -q``, as argparse reads it)."""
    flag = token.partition("=")[0]
    if flag in options:
        return [options[flag]]
    if token.startswith("-") and not token.startswith("--") and len(token) > 2:
        found = [options.get(f"-{letter}") for letter in token[1:]]
        return [action for action in found if action is not None and action.nargs == 0]
    return []


def _empty(option: str | None) -> str:
    if option is None:
        return "empty argument (\"\" or ''): give a word or leave it out"
    return f"argument {option}: empty value: give one or leave {option} out"
