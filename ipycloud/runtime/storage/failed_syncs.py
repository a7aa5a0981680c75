"""Final syncs that failed at exit, kept on disk for the next session to show.

A background sync runs once more as its process exits, when nobody is left to see an
exception. Its failure is written to the process's own stderr (a kernel's reaches the
Jupyter server's log) and recorded as one small JSON file per pair of folders in
ipycloud's state folder: ``platformdirs.user_state_path("ipycloud")/failed-syncs``
(``$XDG_STATE_HOME/ipycloud`` or ``~/.local/state/ipycloud`` on Linux). That outlives a
kernel restart on the machine, and lies in neither synced folder: the source is the
user's, and the destination is often the very storage that failed. The next sync of the
pair shows the record and, once it succeeds, forgets it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ipycloud.runtime.durable import write_bytes_atomically
from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.untrusted import is_unix_time, load_json, read_small

MAX_RECORD_BYTES = 64 * 1024  # a longer record is not one

__all__ = ["FailedSync", "failed_syncs", "failure_of", "forget_failure", "record_failure",
           "report_at_exit"]


@dataclass(frozen=True)
class FailedSync:
    """A final sync from ``src`` to ``dst`` (resolved paths) that failed at exit."""

    src: str
    dst: str
    time: float  # seconds since the epoch
    error: str  # ``Type: message``

    def when(self) -> str:
        """Its local date and time to the minute: ``2025-01-31 12:03``."""
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.time))

    def describe(self, remedy: str | None = None) -> str:
        """What failed and what to run about it (``remedy``; default: the Python call)."""
        remedy = remedy or f"ipycloud.sync({self.src!r}, {self.dst!r})"
        return (f"the final sync of {self.src!r} -> {self.dst!r} at exit ({self.when()}) "
                f"failed: {self.error}; run {remedy}")

    def made_up(self) -> str:
        """What a later sync of the pair says about it."""
        return f"it makes up for the final sync at exit ({self.when()}), which failed: {self.error}"

    def __str__(self) -> str:
        return self.describe()


def _folder() -> Path:
    from platformdirs import user_state_path

    return user_state_path("ipycloud") / "failed-syncs"


def _record_path(src: Path, dst: Path) -> Path:
    """The record of a pair: named by a digest of both paths (any name, any length)."""
    key = os.fsencode(src) + b"\0" + os.fsencode(dst)
    return _folder() / f"{hashlib.sha256(key).hexdigest()[:32]}.json"


def record_failure(src: Path, dst: Path, error: BaseException) -> FailedSync:
    """Record that the final sync from ``src`` to ``dst`` failed with ``error`` just now."""
    failure = FailedSync(str(src), str(dst), time.time(), describe_error(error))
    path = _record_path(src, dst)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(path, json.dumps(asdict(failure)).encode())
    return failure


def _read(path: Path) -> FailedSync | None:
    """The record in ``path``; None when it is missing, unreadable, not a regular file of
    at most MAX_RECORD_BYTES, or not one."""
    try:
        return parse_failed_sync(read_small(path, MAX_RECORD_BYTES))
    except (OSError, ValueError):
        return None


def parse_failed_sync(data: bytes) -> FailedSync | None:
    """The record a file holding ``data`` keeps; None where it is not one (not JSON,
    fields missing or of other types: text, and a Unix time)."""
    try:
        failure = FailedSync(**load_json(data))
    except (ValueError, TypeError):
        return None
    texts = (failure.src, failure.dst, failure.error)
    sound = all(isinstance(text, str) for text in texts) and is_unix_time(failure.time)
    return failure if sound else None


def failure_of(src: Path, dst: Path) -> FailedSync | None:
    """The recorded failure of the final sync from ``src`` to ``dst``, if there is one."""
    return _read(_record_path(src, dst))


def failed_syncs() -> list[FailedSync]:
    """Every recorded failure, oldest first."""
    try:
        paths = [path for path in _folder().iterdir()
                 if path.suffix == ".json" and not path.name.startswith(".")]
    except OSError:
        return []
    return sorted(filter(None, map(_read, paths)), key=lambda failure: failure.time)


def forget_failure(src: Path, dst: Path) -> None:
    """Drop the record of the pair (a sync of it has succeeded since)."""
    with contextlib.suppress(OSError):
        _record_path(src, dst).unlink()


def report_at_exit(src: Path, dst: Path, error: BaseException) -> FailedSync:
    """Record a failed final sync and write it on the process's own stderr."""
    try:
        failure = record_failure(src, dst, error)
        unrecorded = ""
    except OSError as record_error:
        failure = FailedSync(str(src), str(dst), time.time(), describe_error(error))
        unrecorded = f" (not recorded for the next session: {describe_error(record_error)})"
    line = f"ipycloud: {failure}{unrecorded}\n"
    with contextlib.suppress(OSError):
        os.write(_process_stderr(), line.encode(errors="backslashreplace"))
    return failure


def _process_stderr() -> int:
    """The descriptor of the process's own stderr. Under ipykernel, ``sys.stderr`` goes to
    the notebook (gone at exit) and its ``fileno()`` is the original stderr's; else 2."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # None, or a stream without a descriptor
        return 2
