"""Quantities read from people: sizes with or without a unit."""

from __future__ import annotations

import pytest

from ipycloud.runtime.units import parse_size


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
