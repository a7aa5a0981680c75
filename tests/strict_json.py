"""Reading what ipycloud writes as strict JSON, and record lines that try to break readers."""

from __future__ import annotations

import json
from typing import Any

# Record lines that broke every reader of a run log before readers took any bytes.
HOSTILE_RECORD_LINES = [
    "[" * 100_000 + "]" * 100_000,  # too deep for the JSON parser
    '{"t": ' + "9" * 400 + ', "kind": "step", "step": 4}',
    '{"t": 1700000004.0, "kind": "step", "step": ' + "9" * 400 + "}",
    '{"t": 1e300, "kind": "step", "step": 5}',
    '{"t": Infinity, "kind": "step", "step": 6}',
    '{"t": NaN, "kind": "step", "step": 7}',
    "\x00\xff not json",
]


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def loads(text: str | bytes) -> Any:
    """``text`` parsed as strict JSON: ValueError where it holds NaN or an infinity."""
    return json.loads(text, parse_constant=_refuse)
