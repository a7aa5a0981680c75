"""A task file's YAML: nested mappings of strings, whole numbers and booleans, scripts as
literal blocks, so the file reads as a person would write it.

Written here rather than with a YAML library, which would be a dependency of every
install for one fixed shape of file. Strings are double-quoted with YAML's escapes, so
any text (quotes, colons, ``#``, newlines) reads back as it was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Words that YAML 1.1 (PyYAML, so SkyPilot) reads as booleans or null, not as text.
_NOT_TEXT = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
_INDENT = "  "


def to_yaml(mapping: Mapping[str, Any], comments: tuple[str, ...] = ()) -> str:
    """The document: ``comments`` (each line of them after a ``#``, its unprintable
    characters as escapes), then ``mapping``."""
    lines = ["# " + "".join(map(_printable, line))
             for comment in comments for line in comment.splitlines()]
    _emit(mapping, "", lines)
    return "\n".join(lines) + "\n"


def _emit(mapping: Mapping[str, Any], indent: str, lines: list[str]) -> None:
    for key, value in mapping.items():
        head = f"{indent}{_key(key)}:"
        if isinstance(value, Mapping):
            lines.append(head)
            _emit(value, indent + _INDENT, lines)
        elif isinstance(value, str) and _fits_a_block(value):
            lines.append(f"{head} |")
            lines.extend(f"{indent}{_INDENT}{line}" if line else ""
                         for line in value[:-1].split("\n"))
        else:
            lines.append(f"{head} {_scalar(value)}")


def _key(key: str) -> str:
    plain = _PLAIN_KEY.fullmatch(key) and key.lower() not in _NOT_TEXT
    return key if plain else quoted(key)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quoted(value)
    raise TypeError(f"no YAML for {type(value).__name__}")


def _fits_a_block(text: str) -> bool:
    """Whether a literal block (``|``) holds ``text`` exactly: lines of printable text
    ending in one newline, the first not indented."""
    body = text[:-1]
    return (text.endswith("\n") and "\n" in body and not body.endswith("\n")
            and not text.startswith((" ", "\n"))
            and all(char.isprintable() for char in body.replace("\n", "")))


def quoted(text: str) -> str:
    """``text`` as a double-quoted YAML scalar."""
    return '"' + "".join("\\" + char if char in '"\\' else _printable(char)
                         for char in text) + '"'


def _printable(char: str) -> str:
    """``char``, or its escape (``\\u0007``) when YAML may not hold it as it is."""
    if char.isprintable():
        return char
    return f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}"
