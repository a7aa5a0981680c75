"""A word of a command line that a person copies into bash: quoted so that bash reads it
back exactly, and printable so that it shows as it is read (in a terminal, in a YAML
comment)."""

from __future__ import annotations

import shlex

__all__ = ["shell_word"]


def shell_word(text: str) -> str:
    """``text`` as one bash word: ``shlex.quote`` for printable text, else bash's ANSI-C
    quoting (``$'tab\\there'``), which spells each unprintable character as escapes of its
    bytes."""
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_ansi_c(char) for char in text) + "'"


def _ansi_c(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if char.isprintable():
        return char
    # Its bytes, so that bash makes the same name whatever its locale (a name that is not
    # UTF-8 holds its bytes as surrogates).
    return "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape"))
