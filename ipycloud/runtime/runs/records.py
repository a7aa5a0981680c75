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

import contextlib
import itertools
import json
import os
import re
from collections import deque
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ipycloud.runtime.durable import write_bytes_atomically
from ipycloud.runtime.untrusted import (
    is_count,
    is_unix_time,
    load_json,
    open_regular,
    read_small,
    strict,
    strict_dumps,
)
from ipycloud.runtime.user_warning import warn

RECORD_FOLDER = ".ipycloud-runs"
SUFFIX = ".jsonl"
START, STEP, EPOCH, CHECKPOINT, EVENT, END = "start", "step", "epoch", "checkpoint", "event", "end"
KINDS = (START, STEP, EPOCH, CHECKPOINT, EVENT, END)
RUN_ID = re.compile(r"[0-9a-f]{12}")
MAX_LINE_BYTES = 1 << 20  # a longer line is no record: skipped, never held whole
CHUNK_BYTES = 1 << 20  # read at a time
MAX_WARNINGS = 10  # damaged lines told for one log, the first ones
MAX_TEXT = 1000  # characters of a record's text kept (and of a field's name)
MAX_FIELDS = 64  # fields of an object, items of a list, kept
MAX_NESTING = 3  # objects and lists within a record, kept that deep
MAX_INDEX_ENTRY = 64 * 1024  # bytes of an entry of the index of runs, at most
SEARCH_DEPTH = 4  # folders below a folder without logs that ``find_logs`` looks in
SEARCH_FOLDERS = 2000  # and the folders it reads at most
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
        return parse_index_entry(read_small(path, MAX_INDEX_ENTRY))
    except (OSError, ValueError):
        return None


def parse_index_entry(data: bytes) -> dict[str, Any] | None:
    """The entry of the index a file holding ``data`` is; None where it is not one (not a
    JSON object naming its log as a path)."""
    try:
        entry = load_json(data)
    except ValueError:
        return None
    log = entry.get("log") if isinstance(entry, dict) else None
    return entry if isinstance(log, str) and log and "\0" not in log else None


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


def entry_processes(entry: dict[str, Any]) -> set[tuple[int, str]]:
    """The (pid, host) of the process that writes an index entry's run and of those that
    follow it, where the entry names them as a count and a text (another program's entry
    may hold anything there)."""
    return {(named["pid"], named["host"]) for named in [entry, *followers(entry)]
            if is_count(named.get("pid")) and isinstance(named.get("host"), str)}


def _write_entry(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(path, json.dumps(entry).encode())


def logs_in(folder: Path) -> list[Path]:
    """The run logs of a checkpoint folder (or of a folder of logs), as absolute paths,
    unsorted: regular files, never symlinks. A folder with neither finds those of the
    ``.ipycloud-runs`` folders in its subfolders (``find_logs``). Raises the OSError of a
    folder that cannot be read."""
    folder = Path(os.path.abspath(folder))
    inner = folder / RECORD_FOLDER
    found = _logs_of(inner if inner.is_dir() and not inner.is_symlink() else folder)
    return found or find_logs(folder)


def _logs_of(folder: Path) -> list[Path]:
    with os.scandir(folder) as entries:
        return [Path(entry.path) for entry in entries
                if entry.name.endswith(SUFFIX) and RUN_ID.fullmatch(entry.name[:-len(SUFFIX)])
                and entry.is_file(follow_symlinks=False)]


def find_logs(root: Path, depth: int = SEARCH_DEPTH, most: int = SEARCH_FOLDERS,
              skipped: Collection[str] = (), until: Callable[[], bool] = lambda: False
              ) -> list[Path]:
    """The logs in the ``.ipycloud-runs`` folders under ``root``, found breadth first down
    to ``depth`` folders below it, reading ``most`` folders at most, and none once
    ``until()`` is true; hidden folders, ``skipped`` ones and links are passed by (no
    loop), and a folder that cannot be read is left out."""
    logs: list[Path] = []
    pending = deque([(root, 0)])  # breadth first: a bound stops the search in the deepest
    read = 0
    while pending and read < most and not until():
        folder, below = pending.popleft()
        read += 1
        try:
            with os.scandir(folder) as entries:
                folders = [entry for entry in entries if entry.is_dir(follow_symlinks=False)]
        except OSError:  # permissions, a mount gone
            continue
        for entry in folders:
            if entry.name == RECORD_FOLDER:
                with contextlib.suppress(OSError):
                    logs.extend(_logs_of(Path(entry.path)))
            elif below < depth and not entry.name.startswith(".") and entry.name not in skipped:
                pending.append((Path(entry.path), below + 1))
    return logs


def read_records(path: Path, torn_tail: bool = True) -> list[dict[str, Any]]:
    """Every record of the log at ``path``, in order (``log_reader.LogReader`` reads a log
    as it grows, in bounded memory). A damaged line is skipped with a RunRecordWarning (at
    most MAX_WARNINGS of them), and so is a last line without its newline (a torn one:
    ``torn_tail=False`` leaves it out without a word, for a log a writer still writes).
    Raises only the OSError of a file that cannot be read or is not a regular file (a
    symlink, a FIFO)."""
    lines = Lines(path)
    found: list[dict[str, Any]] = []
    fd = open_regular(path)
    try:
        while chunk := os.read(fd, CHUNK_BYTES):
            found.extend(lines.feed(chunk))
    finally:
        os.close(fd)
    if torn_tail:
        lines.end()
    return found


class Lines:
    """The records on the lines of one log, fed to it in chunks of bytes as they are
    read: a line longer than MAX_LINE_BYTES is never held whole, and each damaged line is
    told once with a RunRecordWarning, MAX_WARNINGS at most for the log (none where not
    ``tell``: lines read again, told when first read)."""

    def __init__(self, path: Path, tell: bool = True) -> None:
        self.path = path
        self.tell = tell
        self.number = 0  # of whole lines taken
        self.damaged = 0  # lines that were not records
        self._tail = bytearray()  # the start of the next line
        self._too_long = False  # the next line is over MAX_LINE_BYTES: skip to its end
        self._told_tail: int | None = None  # the line whose missing newline was told

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """The records of the lines ``chunk`` completes."""
        pieces = chunk.split(b"\n")
        found = []
        for index, piece in enumerate(pieces):
            if index == len(pieces) - 1:
                self._keep(piece)
                break
            self.number += 1
            if self._too_long or len(self._tail) + len(piece) > MAX_LINE_BYTES:
                self._too_long = False
                self._tail.clear()
                self._damaged(f"line {self.number} is over {MAX_LINE_BYTES:,} bytes")
                continue
            line = bytes(self._tail + piece) if self._tail else piece
            self._tail.clear()
            if not line.strip():
                continue
            record = parse_record(line)
            if record is None:
                self._damaged(f"line {self.number} is not a record")
            else:
                found.append(record)
        return found

    def _keep(self, piece: bytes) -> None:
        if self._too_long:
            return
        if len(self._tail) + len(piece) > MAX_LINE_BYTES:
            self._too_long = True
            self._tail.clear()
        else:
            self._tail += piece

    def pending(self) -> int | None:
        """The bytes held of the line not yet complete; None where it is over
        MAX_LINE_BYTES (skipped to its end, its start not known)."""
        return None if self._too_long else len(self._tail)

    def end(self) -> None:
        """Tell, once, of a last line without its newline (cut short by a kill): not read."""
        pending = self._too_long or bool(self._tail.strip())
        if pending and self._told_tail != self.number:
            self._told_tail = self.number
            self._damaged("its last line, cut short, is not a record")

    def _damaged(self, what: str) -> None:
        self.damaged += 1
        if self.tell and self.damaged <= MAX_WARNINGS:
            more = (" (the log's further damaged lines are skipped without a word)"
                    if self.damaged == MAX_WARNINGS else "")
            warn(f"run log {self.path}: {what}; skipped{more}", RunRecordWarning)


def parse_record(line: bytes) -> dict[str, Any] | None:
    """The record on ``line``, or None where it is not one: not a JSON object of at most
    MAX_LINE_BYTES, nested at most ``untrusted.MAX_DEPTH`` deep, whose ``t`` is a Unix time,
    ``kind`` one of KINDS and fields of its kind those it needs (``step`` and ``epoch``
    counts). Its values are bounded: text cut to MAX_TEXT characters, at most MAX_FIELDS
    fields of an object and MAX_FIELDS items of a list, nested at most MAX_NESTING deep,
    non-finite numbers None."""
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        record = load_json(line)
    except ValueError:
        return None
    if (not isinstance(record, dict) or not is_unix_time(record.get("t"))
            or record.get("kind") not in KINDS):
        return None
    for name, kind in _NEEDED.get(record["kind"], {}).items():
        value = record.get(name)
        if not (is_count(value) if kind is int else isinstance(value, kind)):
            return None
    return record if len(line) <= MAX_TEXT else _bounded(record, 0)  # short: bounded as is


def _bounded(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, dict):
        return None if depth >= MAX_NESTING else {
            key[:MAX_TEXT]: _bounded(item, depth + 1)
            for key, item in itertools.islice(value.items(), MAX_FIELDS)}
    if isinstance(value, list):
        return None if depth >= MAX_NESTING else [
            _bounded(item, depth + 1) for item in value[:MAX_FIELDS]]
    return value


def encode(record: dict[str, Any]) -> bytes:
    """One line of a log: ``record`` as compact JSON (values JSON cannot hold as text, and
    infinities, made readable) and a newline."""
    return strict_dumps(record, separators=(",", ":"), default=_plain).encode() + b"\n"


def _plain(value: Any) -> Any:
    """A value JSON does not know as a float (a NumPy scalar, a 0-d tensor: None where it
    is NaN or infinite) or text."""
    try:
        return strict(float(value))
    except (TypeError, ValueError):
        return str(value)
