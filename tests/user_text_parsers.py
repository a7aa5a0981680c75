"""The parsers of text and files a user writes, each as one call on one input, for the
property tests (test_user_text_parsers.py) and the fuzzing benchmark
(benchmarks/parsers_fuzz.py).

A parser's answer to any input is a value or its own one-line error (``Parser.refusals``);
anything else raised, or a message over more than one line, is a bug.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError

from ipycloud.magics._arguments import _HelpRequested, duration, durations, parse_line
from ipycloud.runtime.guard.guard import GuardSettings
from ipycloud.runtime.monitor.prices import PriceError, load_prices
from ipycloud.runtime.notify import urls
from ipycloud.runtime.storage import kaggle_credentials
from ipycloud.runtime.storage.kaggle_credentials import KaggleError
from ipycloud.runtime.units import MAX_DURATION_S, parse_duration, parse_size

MAGICS = ("checkpoint", "mount_storage", "dashboard", "keepalive", "gpuinfo", "notify")


@dataclass(frozen=True)
class Parser:
    """One parser: ``read`` takes one input (text, or the bytes of a file); the errors in
    ``refusals`` are its answer to bad input."""

    name: str
    takes: str  # "text" or "bytes"
    read: Callable[[Any], object]
    refusals: tuple[type[BaseException], ...]


def a_duration(text: str) -> float:
    seconds = parse_duration(text)
    assert 0 < seconds <= MAX_DURATION_S, seconds
    return seconds


def a_size(text: str) -> int:
    size = parse_size(text)
    assert size >= 0, size
    return size


def magic_durations(text: str) -> tuple[float, ...]:
    """What ``--warn 15m,5m`` reads, then ``--every 10m``."""
    duration(text)
    return durations(text)


def guard_settings(text: str) -> GuardSettings:
    """The guard's settings from the durations a user gives (``--interval``, ``--limit``,
    ``--warn``, ``--grace``), any of them a number, not a number, or infinite."""
    values = [float(part) if _is_number(part) else parse_duration(part)
              for part in text.split(";")[:4]]
    values += [60.0, 3600.0, 300.0, 25.0][len(values):]
    settings = GuardSettings(interval_s=values[0], limit_s=values[1], warnings_s=(values[2],),
                             grace_s=values[3])
    settings.check_limit(values[1])
    return settings


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def alert_url(text: str) -> str:
    """An alert URL: its masked form and its secret parts never fail, and the masked form
    shows none of the secret parts after its host; then Apprise's check."""
    masked = urls.mask(text)
    parts = urls.secret_parts(text)
    assert "\n" not in masked
    after_the_host = masked.partition("://")[2].rpartition("/")[2]  # "…" where all is well
    assert all(part not in after_the_host for part in parts if len(part) > 1), masked
    urls.check_url(text)
    return masked


class _Files:
    """A folder of its own for the files the file parsers read, made on first use."""

    def __init__(self) -> None:
        self._folder: Path | None = None

    def write(self, name: str, data: bytes) -> Path:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="ipycloud-parsers-"))
        path = self._folder / name
        path.write_bytes(data)
        return path


_FILES = _Files()


def notify_json(data: bytes) -> list[str]:
    """``notify.json`` as a user may have edited it (read from $IPYCLOUD_CONFIG_DIR)."""
    path = _FILES.write(urls.FILE_NAME, data)
    before = os.environ.get(urls.CONFIG_DIR_ENV)
    os.environ[urls.CONFIG_DIR_ENV] = str(path.parent)
    try:
        return urls.saved_urls()
    finally:
        if before is None:
            del os.environ[urls.CONFIG_DIR_ENV]
        else:
            os.environ[urls.CONFIG_DIR_ENV] = before


def kaggle_json(data: bytes) -> tuple[str, str]:
    path = _FILES.write("kaggle.json", data)
    _, user, key = kaggle_credentials._read_kaggle_json(path)
    return user, key


def price_file(data: bytes) -> object:
    path = _FILES.write("prices.json", data)
    table = load_prices(path, environ={})
    for price in table.instances.values():
        assert math.isfinite(price.usd_per_hour) and price.usd_per_hour >= 0
    return table


def magic_lines() -> list[Parser]:
    """``parse_line`` of each magic of a real shell with ipycloud loaded: a Namespace, the
    help page's request, or a UsageError of one line."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.UsageRecording.enabled = False
    shell = InteractiveShell.instance(config=config)
    shell.run_line_magic("load_ext", "ipycloud")
    return [Parser(f"magic_line %{name}", "text", _line_reader(shell.find_line_magic(name)),
                   (UsageError,))
            for name in MAGICS]


def _line_reader(magic: Callable[..., Any]) -> Callable[[str], object]:
    def read(line: str) -> object:
        try:
            return parse_line(magic, line)
        except _HelpRequested:
            return "help"

    return read


def parsers(lines: list[Parser]) -> list[Parser]:
    """Every parser; ``lines`` are those of the magics' lines (``magic_lines()``)."""
    text_errors = (ValueError,)
    return [
        Parser("duration", "text", a_duration, text_errors),
        Parser("size", "text", a_size, text_errors),
        Parser("magic_durations", "text", magic_durations, (argparse.ArgumentTypeError,)),
        Parser("guard_settings", "text", guard_settings, text_errors),
        Parser("alert_url", "text", alert_url, text_errors),
        *lines,
        Parser("notify_json", "bytes", notify_json, text_errors),
        Parser("kaggle_json", "bytes", kaggle_json, (KaggleError,)),
        Parser("price_file", "bytes", price_file, (PriceError,)),
    ]


def outcome(parser: Parser, value: Any) -> str:
    """``"ok"`` or ``"refused"``; raises what the parser raised otherwise (a bug), and
    AssertionError for a refusal over more than one line."""
    try:
        parser.read(value)
    except parser.refusals as error:
        assert "\n" not in str(error), f"{parser.name}: {error!r}"
        return "refused"
    return "ok"


VALID_SAMPLES: dict[str, list[str | bytes]] = {
    "duration": ["90", "90s", "10m", "1h30m", "2d", "0.5h"],
    "size": ["5000", "4K", "1.5M", "2 GiB", "2TB"],
    "magic_durations": ["15m,5m", "5m", "1h,30m,1m"],
    "guard_settings": ["60;3600;300;25", "1m;2h;15m;30s", "5;100"],
    "alert_url": ["ntfy://ntfy.sh/topic", "json://127.0.0.1:8080/path?x=1",
                  "tgram://123456789:AAH-bot/1234/", "mailto://user:pw@gmail.com"],
    **{f"magic_line %{name}": ["save model --dir '/tmp/my runs' --tag best", "start --every 5m",
                   "sync -- -a b", "add ntfy://ntfy.sh/x", "--json -p", "report --csv a.csv"]
       for name in MAGICS},
    "notify_json": [json.dumps({"urls": ["ntfy://ntfy.sh/x"]}).encode()],
    "kaggle_json": [json.dumps({"username": "me", "key": "abc123"}).encode()],
    "price_file": [json.dumps({"instances": {"aws:g5.xlarge": {
        "gpu": "A10G", "gpus": 1, "usd_per_hour": 1.006, "source": "https://aws",
        "as_of": "2026-01"}}}).encode(),
                   json.dumps({"colab:t4": {"gpu": "T4", "gpus": 1, "units_per_hour": 1.96,
                                            "usd_per_unit": 0.1, "source": "x"}}).encode()],
}
