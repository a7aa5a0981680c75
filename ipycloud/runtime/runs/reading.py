"""Runs read back from their logs: those of a checkpoint folder, or every run started or
followed here."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.log_reader import LogReader
from ipycloud.runtime.runs.summary import RunSummary, summarize
from ipycloud.runtime.user_warning import warn

CACHED_LOGS = 16  # logs whose readers are kept (the last read): read again, they parse
# only what was appended


class UnknownRunError(LookupError):
    """No log of that run: neither a log file nor a run of the index."""


def runs(folder: str | os.PathLike[str] | None = None) -> list[RunSummary]:
    """The runs of ``fit`` whose logs are in the checkpoint ``folder``, newest first; with
    no folder, every run started on this machine by this user, or followed from it with
    ``follow`` (the index).

    ``folder`` may also be a folder of logs (``.ipycloud-runs``), or a folder with neither
    whose subfolders hold runs (``records.find_logs``). A log that cannot be read (or is
    a symlink, a FIFO) is left out with a warning; a damaged line of one is skipped with
    a warning, once. Raises NotADirectoryError (FileNotFoundError) for a ``folder`` that
    is not one.
    """
    if folder is None:
        logs = [path for path in map(_indexed_log, _index_entries()) if path is not None]
    else:
        logs = records.logs_in(checkpoint_folder(Path(folder)))
    summaries = [summary for summary in map(_summary, dict.fromkeys(logs)) if summary]
    return sorted(summaries, key=lambda summary: summary.updated or 0.0, reverse=True)


def read_run(path_or_id: str | os.PathLike[str],
             since: float | None = None) -> tuple[RunSummary, list[dict[str, Any]]]:
    """The summary of one run and its records newer than ``since`` (Unix seconds; None:
    all). ``path_or_id`` is the path of its log or its id (looked up in the index, then
    among the logs of runs without a checkpoint folder). UnknownRunError when there is no
    such run; the OSError of a log that cannot be read."""
    path = _log_of(path_or_id)
    lines = records.read_records(path)
    newer = lines if since is None else [line for line in lines if line["t"] > since]
    return summarize(path, lines), newer


def checkpoint_folder(folder: Path) -> Path:
    """``folder``, which must be one: a FileNotFoundError or NotADirectoryError in one
    line where it is not."""
    if not folder.exists():
        raise FileNotFoundError(f"no folder {str(folder)!r}: give a checkpoint folder "
                                "(fit's checkpoint=)")
    if not folder.is_dir():
        raise NotADirectoryError(f"{str(folder)!r} is not a folder: give a checkpoint folder "
                                 "(fit's checkpoint=)")
    return folder


def _log_of(path_or_id: str | os.PathLike[str]) -> Path:
    text = os.fspath(path_or_id)
    if records.RUN_ID.fullmatch(text):
        entry = records.read_index_entry(records.index_dir() / f"{text}.json")
        indexed = _indexed_log(entry) if entry is not None else None
        for path in (indexed, records.runs_dir() / f"{text}{records.SUFFIX}"):
            if path is not None and path.is_file():
                return path
        raise UnknownRunError(f"no run {text} here: ipycloud.runs() lists the runs started "
                              "on this machine")
    path = Path(os.path.abspath(text))
    if not path.is_file():
        raise UnknownRunError(f"no run log {text!r}: give a run's id or its .jsonl log")
    return path


def _summary(log: Path) -> RunSummary | None:
    with _readers_lock:
        reader = _readers.pop(log, None) or LogReader(log)
        _readers[log] = reader
        while len(_readers) > CACHED_LOGS:
            _readers.popitem(last=False)
    try:
        reader.read(torn_tail=True)
    except OSError as error:
        warn(f"run log {log} cannot be read ({error.strerror or error}); left out",
             records.RunRecordWarning)
        return None
    return reader.summary()


_readers: OrderedDict[Path, LogReader] = OrderedDict()
_readers_lock = threading.Lock()


def _index_entries() -> list[dict[str, Any]]:
    try:
        paths = list(records.index_dir().glob("*.json"))
    except OSError:
        return []
    return [entry for entry in map(records.read_index_entry, paths) if entry is not None]


def _indexed_log(entry: dict[str, Any]) -> Path | None:
    """The log an index entry names, where it is there (a log on storage not mounted now
    is not)."""
    path = Path(os.path.abspath(entry["log"]))
    try:
        return path if path.is_file() else None
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return None
