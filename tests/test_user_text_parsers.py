"""Property tests of the parsers of what users write (durations, sizes, alert URLs, the
magics' lines, the guard's settings, notify.json, kaggle.json, price files): any input gets
a value or the parser's own one-line refusal, never another exception."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from user_text_parsers import MAGICS, VALID_SAMPLES, Parser, magic_lines, outcome, parsers

from ipycloud.runtime.notify import urls

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# Words the parsers give meaning to, so that generated input reaches past the first check.
WORDS = ["--dir", "--every", "--tag", "--json", "-p", "-h", "--", "-", "=", "'", '"', "\\",
         " ", "#", "save", "list", "start", "add", "sync", "report", "model", "5m", "1h30m", "-5m",
         "ntfy://", "json://", "127.0.0.1", ":", "/", "?", "&", "@", "%", "~", "$HOME", ",",
         ";", "nan", "inf", "1e400", "9" * 30, "0", ".", "d", "s", "GiB", "\x00", "\udcff"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                               max_size=4),
    max_leaves=20)
FIELD_NAMES = st.sampled_from(["urls", "username", "key", "instances", "currency", "gpu",
                               "gpus", "usd_per_hour", "units_per_hour", "usd_per_unit",
                               "source", "as_of", "verified", "note", "aws:g5.xlarge"])
JSON_DOCUMENTS = st.recursive(
    JSON_VALUES, lambda inner: st.dictionaries(FIELD_NAMES, inner, max_size=6), max_leaves=30)


@pytest.fixture(scope="module")
def all_parsers() -> Iterator[dict[str, Parser]]:
    yield {parser.name: parser for parser in parsers(magic_lines())}


def texts(name: str) -> st.SearchStrategy[str]:
    samples = [sample for sample in VALID_SAMPLES[name] if isinstance(sample, str)]
    return (st.text() | st.lists(st.sampled_from(WORDS + samples), max_size=12).map("".join)
            | st.sampled_from(samples))


def documents(name: str) -> st.SearchStrategy[bytes]:
    samples = [sample for sample in VALID_SAMPLES[name] if isinstance(sample, bytes)]
    return (st.binary(max_size=200) | st.sampled_from(samples)
            | JSON_DOCUMENTS.map(lambda value: json.dumps(value).encode())
            | st.integers(1, 100_000).map(lambda depth: b"[" * depth + b"]" * depth)
            | st.integers(1, 10_000).map(lambda digits: b'{"gpus": ' + b"9" * digits + b"}"))


@pytest.mark.parametrize("name", ["duration", "size", "magic_durations", "guard_settings",
                                  *(f"magic_line %{magic}" for magic in MAGICS)])
def test_any_text_gets_a_value_or_a_one_line_refusal(all_parsers: dict[str, Parser],
                                                     name: str) -> None:
    @SETTINGS
    @given(text=texts(name))
    def check(text: str) -> None:
        outcome(all_parsers[name], text)

    check()


@settings(max_examples=100, deadline=None)
@given(text=texts("alert_url"))
def test_any_alert_url_is_masked_and_checked_in_one_line(text: str) -> None:
    (alert_url,) = [parser for parser in parsers([]) if parser.name == "alert_url"]
    outcome(alert_url, text)


@pytest.mark.parametrize("name", ["notify_json", "kaggle_json", "price_file"])
def test_any_file_gets_a_value_or_a_one_line_refusal(all_parsers: dict[str, Parser],
                                                     name: str) -> None:
    @SETTINGS
    @given(data=documents(name))
    def check(data: bytes) -> None:
        outcome(all_parsers[name], data)

    check()


def test_a_mask_shows_no_more_than_a_scheme() -> None:
    assert urls.mask("my\nsecret token://x/y") == "…"
    assert urls.mask("ntfys://ntfy.sh/topic") == "ntfys://ntfy.sh/…"


@pytest.mark.parametrize("data", [b"[" * 100_000 + b"]" * 100_000,
                                  b'{"urls": [' + b"9" * 5000 + b"]}"])
def test_a_notify_json_nested_too_deep_or_with_a_huge_number_is_one_line(
        tmp_path, monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setenv("IPYCLOUD_CONFIG_DIR", str(tmp_path))
    (tmp_path / "notify.json").write_bytes(data)
    with pytest.raises(ValueError, match=r"^(cannot read )?\S*notify\.json\b.*: fix or delete "
                                         r"it$"):
        urls.saved_urls()
