"""Files that other processes or people can write, read without trusting them.

``open_regular`` opens a regular file and nothing else: never through a symlink (unless
asked), never waiting on a FIFO or a device. ``read_small`` reads such a file of at most a
given size. ``load_json`` parses JSON into values every reader can use as they are: nesting
at most MAX_DEPTH deep, integers within MAX_INT, finite floats (NaN, Infinity, 1e400 and
integers too long become None), text without lone surrogates. ``strict`` makes a value
strict JSON for output (non-finite floats become None), as the writers of records do.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import Any

MAX_DEPTH = 32  # arrays and objects nested in one another, at most
MAX_INT = 2**53  # integers beyond it (in either sign) are None: JavaScript's exact range
MAX_INT_DIGITS = 16  # an integer literal longer than this is beyond MAX_INT: not converted
MAX_UNIX_TIME = 1e11  # seconds; a time after it (the year 5138) is no time of a record

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO opens at once instead of waiting a writer


class TooLarge(ValueError):
    """A file longer than its reader takes."""


class NotRegular(OSError):
    """A path that is no regular file to read: a symlink not followed, a FIFO, a device,
    a folder."""


def open_regular(path: str | os.PathLike[str], follow_links: bool = False) -> int:
    """A descriptor of the regular file at ``path``, opened to read. Raises NotRegular
    for a symlink (unless ``follow_links``), a FIFO, a device or a folder, without
    blocking; the OSError of a path that cannot be opened."""
    flags = os.O_RDONLY | os.O_CLOEXEC | _NONBLOCK | (0 if follow_links else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP and not follow_links:
            raise NotRegular(errno.ELOOP, "a symbolic link, not followed", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(path: str | os.PathLike[str], limit: int, follow_links: bool = False) -> bytes:
    """The bytes of the regular file at ``path`` (see ``open_regular``); TooLarge where it
    holds more than ``limit``."""
    fd = open_regular(path, follow_links)
    with os.fdopen(fd, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{path} holds more than {limit:,} bytes")
    return data


def load_json(data: bytes | str) -> Any:
    """``data`` parsed as JSON (see the module's docstring for what becomes None); raises
    ValueError for anything else, nesting too deep included."""
    try:
        value = json.loads(data, parse_int=_integer, parse_float=_finite_float,
                           parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    text = data if isinstance(data, bytes) else data.encode(errors="surrogatepass")
    if text.count(b"[") + text.count(b"{") <= MAX_DEPTH and b"\\u" not in text:
        return value  # nested no deeper than it has brackets, and no escape to check
    return _checked(value, 0)


def _integer(text: str) -> int | None:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return None
    number = int(text)
    return number if -MAX_INT <= number <= MAX_INT else None


def _finite_float(text: str) -> float | None:
    number = float(text)
    return number if math.isfinite(number) else None


def _no_constant(text: str) -> None:
    return None


def _checked(value: Any, depth: int) -> Any:
    """``value`` with its text made encodable; ValueError where it nests too deep."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, list | dict) and depth >= MAX_DEPTH:
        raise ValueError(f"JSON nested more than {MAX_DEPTH} deep")
    if isinstance(value, list):
        return [_checked(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {_text(key): _checked(item, depth + 1) for key, item in value.items()}
    return value


def _text(text: str) -> str:
    """``text`` with its lone surrogates (JSON's ``\\ud800``, which no encoder writes)
    replaced by U+FFFD."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)
    return text


def strict(value: Any) -> Any:
    """``value`` as strict JSON holds it: non-finite floats become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict(item) for item in value]
    return value


def is_count(value: Any) -> bool:
    """Whether ``value`` is an integer from 0 to MAX_INT (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def is_unix_time(value: Any) -> bool:
    """Whether ``value`` is a number of seconds from 0 to MAX_UNIX_TIME (not a bool)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 <= value <= MAX_UNIX_TIME)

