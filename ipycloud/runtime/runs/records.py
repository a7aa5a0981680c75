"""The run record on disk: where each run's log lies, and its lines read back.

A run's log is ``<checkpoint folder>/.ipycloud-runs/<run-id>.jsonl`` (a run without a
checkpoint folder: ``<state dir>/runs/<run-id>.jsonl``), one JSON object per line, each
with ``t`` (Unix seconds) and ``kind``: ``start``, ``step``, ``epoch``, ``checkpoint``,
``event`` or ``end``. ``<state dir>/runs/index/<run-id>.json`` names the log of every run
started on this machine by this user, and of every run followed from it (``follow``): the
process that started it (``pid``, ``host``, ``kernel``) and those that follow it
(``followers``, each with its ``pid``, ``host`` and ``kernel``). The state dir is
``$IPYCLOUD_STATE_DIR``, by default ``~/.local/state/ipycloud`` (platformdirs' user state
folder).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.durable import write_bytes_atomically

RECORD_FOLDER = ".ipycloud-runs"
SUFFIX = ".jsonl"
START, STEP, EPOCH, CHECKPOINT, EVENT, END = "start", "step", "epoch", "checkpoint", "event", "end"
KINDS = (START, STEP, EPOCH, CHECKPOINT, EVENT, END)
RUN_ID = re.compile(r"[0-9a-f]{12}")
CACHED_LOGS = 64  # logs whose lines read are kept, the last read
MAX_FOLLOWERS = 8  # processes an index entry names as following its run, the last ones
# The fields each kind needs, with their types; a line without them is not a record.
_NEEDED: dict[str, dict[str, type | tuple[type, ...]]] = {
    START: {"step": int, "epoch": int},
    STEP: {"step": int},
    EPOCH: {"epoch": int},
    END: {"status": str},
}


class RunRecordWarning(UserWarning):
    """A line of a run's log that is damaged and skipped, or a log that cannot be written."""


def state_dir() -> Path:
    """ipycloud's state folder: ``$IPYCLOUD_STATE_DIR``, else the user state folder."""
    configured = os.environ.get("IPYCLOUD_STATE_DIR")
    if configured:
        return Path(configured).expanduser()
    from platformdirs import user_state_path

    return user_state_path("ipycloud")


def runs_dir() -> Path:
    """Where the logs of runs without a checkpoint folder go."""
    return state_dir() / "runs"


def index_dir() -> Path:
    """Where each run started here is named: ``<run-id>.json`` points to its log."""
    return runs_dir() / "index"


def log_path(folder: Path | None, run: str) -> Path:
    """The log of ``run``, whose checkpoints go to ``folder`` (None: none)."""
    parent = runs_dir() if folder is None else Path(folder) / RECORD_FOLDER
    return parent / f"{run}{SUFFIX}"


def read_index_entry(path: Path) -> dict[str, Any] | None:
    """An entry of the user's index of runs, which names its log; None where it is missing
    or not one."""
    try:
        entry = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("log"), str) else None


def write_index_entry(run: str, entry: dict[str, Any]) -> None:
    """Name ``run``'s log in the index (``entry``: the process that writes it), keeping
    the followers its entry there names; raises the OSError of an index that cannot be
    written."""
    path = index_dir() / f"{run}.json"
    known = read_index_entry(path)
    _write_entry(path, {**entry, "followers": [] if known is None else followers(known)})


def add_follower(run: str, log: Path, follower: dict[str, Any]) -> None:
    """Note in the index that ``follower`` (its ``pid``, ``host`` and ``kernel``) follows
    ``run`` through its log at ``log``; raises the OSError of an index that cannot be
    written."""
    path = index_dir() / f"{run}.json"
    entry = read_index_entry(path) or {"run": run}
    others = [known for known in followers(entry)
              if (known.get("pid"), known.get("host")) != (follower["pid"], follower["host"])]
    _write_entry(path, {**entry, "log": str(log),
                        "followers": [*others, follower][-MAX_FOLLOWERS:]})


def followers(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The processes an index entry names as following its run."""
    named = entry.get("followers")
    return [follower for follower in named if isinstance(follower, dict)] \
        if isinstance(named, list) else []


def entry_kernels(entry: dict[str, Any]) -> set[str]:
    """The Jupyter kernels an index entry's run is of: the one that started it, and
    those that follow it."""
    return {kernel for kernel in [entry.get("kernel"), *(
        follower.get("kernel") for follower in followers(entry))] if isinstance(kernel, str)}


def _write_entry(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(path, json.dumps(entry).encode())


def logs_in(folder: Path) -> list[Path]:
    """The run logs of a checkpoint folder (or of a folder of logs), as absolute paths,
    unsorted; raises the OSError of a folder that cannot be read."""
    folder = Path(os.path.abspath(folder))
    inner = folder / RECORD_FOLDER
    where = inner if inner.is_dir() else folder
    return [path for path in where.iterdir()
            if path.suffix == SUFFIX and RUN_ID.fullmatch(path.stem) and path.is_file()]


def read_records(path: Path, torn_tail: bool = True) -> list[dict[str, Any]]:
    """The records of the log at ``path``, in order. A damaged line (a torn last line of a
    process killed as it wrote, a corrupt one) is skipped with a RunRecordWarning; raises
    only the OSError of a file that cannot be read.

    The whole lines read are kept (for the last CACHED_LOGS logs read): reading a log
    again parses only what was appended since, so following a long run costs little.
    ``torn_tail=False`` leaves out a last line without its newline, without a warning: a
    reader that follows a live run sees the line the writer is still writing as such.
    """
    with open(path, "rb") as file:
        status = os.fstat(file.fileno())
        identity = (status.st_dev, status.st_ino)
        with _cache_lock:
            known = _cache.get(path)
        if known is None or known.identity != identity or status.st_size < known.offset:
            known = _Read(identity)  # new, replaced or cut: read afresh
        file.seek(known.offset)
        data = file.read()
    whole, newline, tail = data.rpartition(b"\n")
    lines = whole.split(b"\n") if newline else []
    read = _Read(identity, known.offset + len(whole) + len(newline), known.lines + len(lines),
                 known.records + _parsed(path, lines, known.lines))
    with _cache_lock:
        _cache[path] = read
        _cache.move_to_end(path)
        while len(_cache) > CACHED_LOGS:
            _cache.popitem(last=False)
    last = (_parsed(path, [tail], read.lines, cut_short=True)
            if torn_tail and tail.strip() else [])
    return read.records + last


@dataclass(frozen=True)
class _Read:
    """What was read of one log: its whole lines, up to ``offset``."""

    identity: tuple[int, int]  # the file's device and inode
    offset: int = 0
    lines: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)


_cache: OrderedDict[Path, _Read] = OrderedDict()
_cache_lock = threading.Lock()


def _parsed(path: Path, lines: list[bytes], before: int,
            cut_short: bool = False) -> list[dict[str, Any]]:
    """The records on ``lines`` (the first is line ``before + 1``), each damaged one
    skipped with a warning."""
    records = []
    for number, line in enumerate(lines, start=before + 1):
        record = parse_record(line) if line.strip() else None
        if record is not None:
            records.append(record)
        elif line.strip():
            where = "its last line, cut short," if cut_short else f"line {number}"
            warnings.warn(f"run log {path}: {where} is not a record; skipped", RunRecordWarning,
                          stacklevel=3)
    return records


def parse_record(line: bytes) -> dict[str, Any] | None:
    """The record on ``line``, or None where it is not one."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if (not isinstance(record, dict) or not isinstance(record.get("t"), int | float)
            or record.get("kind") not in KINDS):
        return None
    for name, kind in _NEEDED.get(record["kind"], {}).items():
        value = record.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
    return record


def encode(record: dict[str, Any]) -> bytes:
    """One line of a log: ``record`` as compact JSON (values JSON cannot hold as text, and
    infinities, made readable) and a newline."""
    try:
        text = json.dumps(record, separators=(",", ":"), allow_nan=False, default=_plain)
    except ValueError:  # an infinite or NaN metric
        text = json.dumps(_finite(record), separators=(",", ":"), allow_nan=False,
                          default=_plain)
    return text.encode() + b"\n"


def _plain(value: Any) -> Any:
    """A value JSON does not know as a float (a NumPy scalar, a 0-d tensor: None where it
    is NaN or infinite) or text."""
    try:
        return _finite(float(value))
    except (TypeError, ValueError):
        return str(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
