"""Polling for tests: wait until something becomes true, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
             step: float = 0.01) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail with an
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(step)
    return result
