"""Quantities read from people: sizes with or without a unit."""

from __future__ import annotations

import pytest

from ipycloud.runtime.units import counted, parse_size


@pytest.mark.parametrize(("text", "size"), [
    ("0", 0), ("1234", 1234), ("12B", 12), ("4K", 4096), ("4KiB", 4096), ("4kb", 4000),
    ("1.5M", 1572864), ("2 GiB", 2 << 30), ("2GB", 2_000_000_000), ("1T", 1 << 40),
    (" 3g ", 3 << 30),
])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1", "1.5", "1X", "K", "1e9", "1..5M"])
def test_what_is_no_size(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size") as err:
        parse_size(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("number", "noun", "plural", "text"), [
    (1, "file", None, "1 file"), (0, "file", None, "0 files"), (2, "file", None, "2 files"),
    (1, "process", "processes", "1 process"), (3, "process", "processes", "3 processes"),
])
def test_a_count_has_its_noun_in_the_right_number(number, noun, plural, text) -> None:
    assert counted(number, noun, plural) == text
