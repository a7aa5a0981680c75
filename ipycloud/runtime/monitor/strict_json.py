"""JSON text a browser's ``JSON.parse`` always accepts: a number that is not finite (NaN,
an infinity), which Python's encoder would write as ``NaN`` or ``Infinity``, is ``null``."""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(value: Any) -> str:
    """``value`` as strict JSON text, each non-finite float in it as ``null``."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere in it
        return json.dumps(finite(value), allow_nan=False)


def finite(value: Any) -> Any:
    """``value`` with each non-finite float in it (in dicts, lists and tuples) made None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value
