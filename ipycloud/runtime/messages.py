"""Error text for people: one line, whatever the exception carried."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

E = TypeVar("E", bound=BaseException)

# ``[Errno 111] Connection refused`` as nested network errors carry it in their text.
_ERRNO = re.compile(r"\[Errno (-?\d+)\] ([^'\")\]]+)")


def one_line(error: BaseException) -> str:
    """The exception's message with every run of whitespace (newlines too) made one space."""
    return " ".join(str(error).split()) or type(error).__name__


def os_reason(error: BaseException) -> str | None:
    """The operating system's words for an OSError ("Not a directory"), else None."""
    return error.strerror if isinstance(error, OSError) and error.strerror else None


def describe_error(error: BaseException) -> str:
    """``Type: message`` on one line (just ``Type`` when there is no message), for logs and
    notices that list failures."""
    name = type(error).__name__
    return f"{name}: {one_line(error)}" if str(error).strip() else name


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` on one line with every secret replaced by ``***``, longest first (so a
    secret that holds a shorter one is removed whole)."""
    line = " ".join(text.split())
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        line = line.replace(secret, "***")
    return line


def errno_reason(text: str) -> tuple[int, str] | None:
    """The innermost ``[Errno N] reason`` in an error's text, as (N, reason); None if none."""
    found = _ERRNO.findall(text)
    if not found:
        return None
    number, reason = found[-1]
    return int(number), reason.strip()


class ParameterError(ValueError):
    """A mistake whose remedy is a parameter: the runtime names it as Python does, and a
    front can name it its own way (a magic: its option).

    ``template`` holds a ``{name}`` placeholder for each word of ``words``, which maps it to
    its text: a parameter's Python spelling (``competition="competition=True"``), or a
    value (``handle=repr(handle)``, kept out of the template so its braces stay text).
    """

    def __init__(self, template: str, **words: str) -> None:
        self.template = template
        self.words = words
        super().__init__(template.format(**words))

    def in_words_of(self, spellings: Mapping[str, str]) -> str:
        """The message with each word in ``spellings`` spelled its way (the rest as given)."""
        return self.template.format(**{**self.words, **spellings})



def worded(kind: type[E], template: str, /, **words: str) -> E:
    """A ``kind`` error whose message, like a ParameterError's, is ``template`` filled with
    ``words``, so that a front can name the parameters in it its own way (``in_words``)."""
    error = kind(template.format(**words))
    vars(error).update(template=template, words=words)
    return error


def in_words(error: BaseException, spellings: Mapping[str, str]) -> str:
    """The error's one line, with the words of a ParameterError or a ``worded`` error that
    ``spellings`` holds spelled its way."""
    template, words = getattr(error, "template", None), getattr(error, "words", None)
    if not isinstance(template, str) or not isinstance(words, dict):
        return one_line(error)
    return " ".join(template.format(**{**words, **spellings}).split())
