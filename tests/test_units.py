"""Quantities read from people (sizes with or without a unit) and written for them (a size
against its total, in one unit; a rate without exponents)."""

from __future__ import annotations

import pytest

from ipycloud.runtime.units import counted, finite_number, format_of, format_rate, parse_size

MIB, GIB, TIB = 2**20, 2**30, 2**40


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


@pytest.mark.parametrize(("part", "total", "relation", "text"), [
    (256 * MIB, GIB, "of", "256 MiB of 1024 MiB"),  # a 1 GiB container: not "0.2 of 1.0 GiB"
    (0, 2 * GIB, "of", "0 MiB of 2048 MiB"),
    (100 * MIB, int(3.9 * GIB), "of", "100 MiB of 3994 MiB"),
    (int(3.2 * GIB), 16 * GIB, "of", "3.2 GiB of 16.0 GiB"),
    (20 * MIB, 4 * GIB, "of", "0.0 GiB of 4.0 GiB"),
    (45 * GIB, 100 * GIB, "free of", "45.0 GiB free of 100.0 GiB"),
    (TIB, 8 * TIB, "of", "1.0 TiB of 8.0 TiB"),
    (500, 2000, "of", "500 B of 2000 B"),
    (None, 16 * GIB, "of", "n/a of 16.0 GiB"),
])
def test_a_pair_of_sizes_is_written_in_the_unit_of_its_total(
        part: int | None, total: int, relation: str, text: str) -> None:
    assert format_of(part, total, relation) == text


@pytest.mark.parametrize(("number", "noun", "plural", "text"), [
    (1, "file", None, "1 file"), (0, "file", None, "0 files"), (2, "file", None, "2 files"),
    (1, "process", "processes", "1 process"), (3, "process", "processes", "3 processes"),
])
def test_a_count_has_its_noun_in_the_right_number(number, noun, plural, text) -> None:
    assert counted(number, noun, plural) == text


@pytest.mark.parametrize(("rate", "text"), [
    (1560.4, "1560"), (123456.0, "123456"), (99.96, "100"), (12.345, "12.3"), (2.0, "2"),
    (0.5, "0.5"), (0.01234, "0.0123"), (0.0000278, "0.0000278"), (0.0, "0"),
])
def test_a_rate_is_written_for_people_without_an_exponent(rate: float, text: str) -> None:
    assert format_rate(rate) == text


@pytest.mark.parametrize(("value", "finite"), [
    (0, True), (-3, True), (0.5, True), (2**1000, True), (-(10**300), True),
    (10**400, False), (-(10**400), False), (float("nan"), False), (float("inf"), False),
    (True, False), ("1", False), (None, False),
], ids=lambda value: f"{value!r:.12}")
def test_a_finite_number_can_rank_and_an_int_beyond_a_float_cannot(value: object,
                                                                   finite: bool) -> None:
    assert finite_number(value) is finite
