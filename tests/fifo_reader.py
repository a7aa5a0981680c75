"""A reader called with a FIFO in place of its file, in a thread: one that blocks on the FIFO
fails its test (and is let go) instead of hanging it."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

WAIT_S = 60.0  # far longer than any read of a small file, even on a loaded machine

T = TypeVar("T")


def read_with_fifo_at(path: Path, read: Callable[[], T]) -> T:
    """``read()`` called with a FIFO made at ``path``: what it returns, or raises what it
    raised. AssertionError when it is still blocked after WAIT_S."""
    os.mkfifo(path)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = read()
        except BaseException as error:
            outcome["error"] = error

    reader = threading.Thread(target=call, daemon=True)
    reader.start()
    reader.join(WAIT_S)
    blocked = reader.is_alive()
    if blocked:
        with contextlib.suppress(OSError):  # a writer that comes and goes ends its open()
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(WAIT_S)
    assert not blocked, f"the reader of {path.name} blocked on a FIFO"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
