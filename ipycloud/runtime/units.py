"""Quantities as people read them: bytes in binary units, durations in hours and minutes.

A pair of sizes (used of a limit, free of a disk) is shown in one unit, chosen for the larger
one (``size_unit``), as the lab extension's ``format.ts`` does: ``256 MiB of 1024 MiB`` under
a 1 GiB limit, where GiB with one decimal would read ``0.2 GiB of 1.0 GiB``.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard

NA = "n/a"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
PAIR_UNIT_MIN = 4  # a pair is shown in the largest unit of which its total holds this many
MAX_DURATION_S = 30 * 86400  # what a duration given as text may be at most: 30 days


def finite_number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` is an int or float (not a bool) that is neither NaN nor infinite
    nor an int beyond a float's range: a metric that can rank epochs and checkpoints."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # math.isfinite(10**400): the int has no float
        return False


def as_float(value: Any) -> float:
    """``float(value)``, with an int beyond a float's range as the infinity it rounds to
    (``float(10**400)`` raises OverflowError); TypeError or ValueError for a non-number."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """The number with its noun in the right number: ``1 file``, ``0 files``, ``2 GPUs``
    (``plural`` where adding an s is wrong)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def format_bytes(value: float | None) -> str:
    """Bytes in binary units with one decimal: ``15.0 GiB``; None as n/a."""
    if value is None:
        return NA
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def size_unit(total: float) -> tuple[str, int]:
    """The unit, and its size in bytes, in which a pair of sizes up to ``total`` is shown:
    the largest binary unit of which ``total`` holds at least PAIR_UNIT_MIN (MiB below 4
    GiB, GiB from 4 GiB to 4 TiB)."""
    power = 0
    while power < len(_UNITS) - 1 and abs(total) >= PAIR_UNIT_MIN * 1024 ** (power + 1):
        power += 1
    return _UNITS[power], 1024 ** power


def format_in(value: float, unit: tuple[str, int]) -> str:
    """Bytes in ``unit`` (from ``size_unit``): whole up to MiB, one decimal from GiB."""
    name, size = unit
    digits = 1 if size >= 1024 ** 3 else 0
    return f"{value / size:.{digits}f} {name}"


def format_of(part: float | None, total: float, relation: str = "of") -> str:
    """``256 MiB of 1024 MiB``, ``45.0 GiB free of 100.0 GiB``: both in ``total``'s unit;
    an unknown ``part`` as n/a."""
    unit = size_unit(total)
    known = NA if part is None else format_in(part, unit)
    return f"{known} {relation} {format_in(total, unit)}"


def format_percent(value: float | None) -> str:
    """A percentage 0-100 to the whole percent: ``42%``; None as n/a."""
    return NA if value is None else f"{value:.0f}%"


def format_duration(seconds: float | None) -> str:
    """Seconds as ``12 h`` or ``1 h 30 min``; None as "none known"."""
    if seconds is None:
        return "none known"
    if seconds < 60 or not math.isfinite(seconds):  # NaN and infinity: "nan s", "inf s"
        return f"{seconds:.0f} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    parts = [f"{hours} h"] if hours else []
    if minutes or not hours:
        parts.append(f"{minutes} min")
    return " ".join(parts)


def format_seconds(value: float) -> str:
    """Seconds as people read them, short ones kept exact enough: ``0.5 s``, ``25 s``, ``2 h``."""
    return format_duration(value) if value >= 60 else f"{value:.3g} s"  # NaN: "nan s"


def format_rate(value: float) -> str:
    """A rate (steps/s) as people read it: three significant figures and never an
    exponent: ``1560``, ``12.3``, ``0.5``, ``0.0000278``."""
    if not math.isfinite(value) or value == 0:
        return f"{value:g}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    decimals = 2 - math.floor(math.log10(abs(value)))
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``10m``, ``1h30m`` or ``2d``, up to MAX_DURATION_S;
    ValueError otherwise."""
    cleaned = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        seconds = float(cleaned)
    elif cleaned and _DURATION.sub("", cleaned) == "":
        seconds = sum(float(number) * _DURATION_UNITS[unit]
                      for number, unit in _DURATION.findall(cleaned))
    else:
        raise ValueError(f"{text!r} is not a duration: write it like 90s, 10m, 1h30m or 2d")
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than {MAX_DURATION_S // 86400:.0f} days: give at "
                         f"most {MAX_DURATION_S // 86400:.0f}d")
    return seconds


_SIZE = re.compile(r"(\d+)(?:\.(\d+))?\s*(?:([kmgt])(ib|b)?|b)?")
_SIZE_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str) -> int:
    """Bytes from ``5000``, ``4K``/``4KiB`` (1024-based), ``4KB`` (1000-based), up to T.

    Whole bytes only: ``1.5M`` is fine, ``1.5`` is not. ValueError otherwise.
    """
    found = _SIZE.fullmatch(text.strip().lower())
    if found is None:
        raise ValueError(f"{text!r} is not a size: write it like 5000, 500M, 20GiB or 2TB")
    whole, fraction, power, suffix = found.groups()
    scale = (1000 if suffix == "b" else 1024) ** _SIZE_POWERS.get(power or "", 0)
    digits = fraction or ""
    value, rest = divmod(int(whole + digits) * scale, 10 ** len(digits))
    if rest and power is None:
        raise ValueError(f"{text!r} is not a size: whole bytes only, or a unit such as 1.5G")
    return value
