"""Generated inputs for the readers of files that a user or another process can write (run
logs, the index of runs, checkpoint manifests, folder leases, partial-download metadata,
failed-sync records), and the check of what each reader gives back. Shared by the property
tests (tests/test_readers_properties.py) and the fuzzing benchmark
(benchmarks/readers_fuzz.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from ipycloud.runtime.checkpoint.catalog import CheckpointTable, parse_manifest
from ipycloud.runtime.checkpoint.leases import parse_lease, process_alive
from ipycloud.runtime.runs import RunsTable
from ipycloud.runtime.runs.records import (
    KINDS,
    Lines,
    entry_kernels,
    followers,
    parse_index_entry,
    parse_record,
)
from ipycloud.runtime.runs.summary import (
    KEPT_NOTES,
    MAX_EPOCH_ROWS,
    MAX_STEP_ROWS,
    RunState,
    RunSummary,
    progress_line,
)
from ipycloud.runtime.storage.failed_syncs import parse_failed_sync
from ipycloud.runtime.storage.partial import parse_validators
from ipycloud.runtime.untrusted import is_unix_time

# Numbers that broke readers: huge, infinite, NaN, beyond the range of a time.
NUMBERS = st.one_of(
    st.integers(), st.integers(min_value=10**300, max_value=10**401),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1e300, 2**53 + 1, -1, 0, 1_700_000_000.5]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=40))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
DEEP = st.integers(min_value=30, max_value=3000).map(lambda depth: "[" * depth + "]" * depth)


def dumped(value: Any) -> bytes:
    """``value`` as JSON text as any writer may write it (NaN and Infinity included)."""
    return json.dumps(value).encode()


def fields_over(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``base`` with some of its fields given any JSON value, and some fields added."""
    return st.tuples(
        st.dictionaries(st.sampled_from(sorted(base)), JSON_VALUES, max_size=len(base)),
        st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=2),
    ).map(lambda changes: {**base, **changes[0], **changes[1]})


def file_contents(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Any bytes, any JSON, nesting too deep, or ``base`` with fields changed."""
    return st.one_of(st.binary(max_size=300), JSON_VALUES.map(dumped),
                     DEEP.map(str.encode), fields_over(base).map(dumped))


RECORD = {"t": 1_700_000_000.0, "kind": "step", "step": 3, "epoch": 0, "loss": 0.5,
          "pid": 1, "host": "here", "total_steps": 10, "epochs": 2, "status": "finished",
          "best": {"metric": "val_loss", "value": 0.1, "epoch": 0}, "reason": "why",
          "notebook": "train.ipynb", "kernel": "4f6c", "folder": "/ck", "device": "cpu",
          "model": "MLP", "session_left_s": 60.0}
RECORD_LINES = st.one_of(
    st.binary(max_size=200), JSON_VALUES.map(dumped), DEEP.map(str.encode),
    st.tuples(st.sampled_from(KINDS), fields_over(RECORD)).map(
        lambda kind_fields: dumped({**kind_fields[1], "kind": kind_fields[0]})))
LOGS = st.lists(RECORD_LINES, max_size=12)

MANIFEST = {"format": "ipycloud-checkpoint/1", "name": "step-000000001", "step": 1,
            "sequence": 1, "time": 1_700_000_000.0, "tag": None, "epoch": 0,
            "data_position": None, "metrics": {"val_loss": 0.5}, "objects": {"model": "state"},
            "rng": ["torch"], "versions": {"torch": "2.0"},
            "files": {"step-000000001.pt": {"size": 10, "crc32": "00000000"}},
            "keep_best": ["val_loss", "min", 1], "run": "a1b2c3d4e5f6"}
LEASE = {"run": "a1b2c3d4e5f6", "pid": 1, "host": "here", "started": 1_700_000_000.0,
         "notebook": "train.ipynb"}
PART_META = {"url": "https://example.com/data.bin", "etag": '"abc"',
             "last_modified": "Mon, 01 Jan 2024 00:00:00 GMT", "size": 10}
FAILED_SYNC = {"src": "/content/ck", "dst": "/drive/ck", "time": 1_700_000_000.0,
               "error": "OSError: no space left"}
INDEX_ENTRY = {"run": "a1b2c3d4e5f6", "log": "/nowhere/a1b2c3d4e5f6.jsonl", "pid": 1,
               "host": "here", "kernel": None, "followers": []}


def strict_text(value: Any) -> str:
    """``value`` as strict JSON (raises ValueError on NaN or Infinity)."""
    return json.dumps(value, allow_nan=False)


def finite_numbers(value: Any) -> bool:
    """Whether every float in ``value`` is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(map(finite_numbers, value.values()))
    if isinstance(value, list | tuple):
        return all(map(finite_numbers, value))
    return True


# -- what each reader must give back --------------------------------------------------------

MAX_OUT = 6  # strict JSON out is at most this many times the input (escapes), plus a little


def check_record_line(line: bytes) -> None:
    """A record line read: nothing or an object with a time and a kind, bounded, strict."""
    record = parse_record(line)
    if record is not None:
        assert is_unix_time(record["t"]) and record["kind"] in KINDS
        assert len(strict_text(record)) <= MAX_OUT * len(line) + 16


def check_log_lines(lines: list[bytes], log: Path = Path("a1b2c3d4e5f6.jsonl")) -> None:
    """A log of ``lines`` summed up as a reader takes it (in two reads): a summary that is
    strict JSON, a table and a progress line that print, bounded rows."""
    data = b"\n".join(lines) + b"\n"
    middle = len(data) // 2
    reader, state = Lines(log), RunState()
    for chunk in (data[:middle], data[middle:]):
        for record in reader.feed(chunk):
            state.add(record)
    reader.end()
    check_summary(state.summary(log, now=1_700_000_100.0))
    assert len(state.records()) <= MAX_STEP_ROWS + MAX_EPOCH_ROWS + 2 * KEPT_NOTES + 2


def check_summary(summary: RunSummary) -> None:
    strict_text(summary.to_json())
    str(RunsTable([summary], "here"))
    RunsTable([summary], "here").html()
    progress_line(summary)


def check_manifest(data: bytes) -> None:
    """A manifest read: refused with ValueError, or a checkpoint whose line, table and
    manifest (strict JSON) are made."""
    try:
        info = parse_manifest(data, "step-000000001", Path("/ck"))
    except ValueError:
        return
    info.summary()
    str(CheckpointTable(Path("/ck"), [info], info))
    strict_text(info.to_manifest())
    assert all(finite_numbers(value) for value in info.metrics.values())


def check_lease(data: bytes) -> None:
    """A lease read: nothing, or a writer of this file's run whose liveness is known."""
    writer = parse_lease(data, ".ipycloud-run-a1b2c3d4e5f6.json")
    if writer is not None:
        writer.describe()
        process_alive(writer.pid, writer.host, writer.started)


def check_part_meta(data: bytes) -> None:
    """Partial-download metadata read: nothing, or validators a request can send."""
    validators = parse_validators(data)
    if validators is not None:
        for header in (validators.if_range, validators.url):
            assert header is None or (isinstance(header, str) and header.isprintable())


def check_failed_sync(data: bytes) -> None:
    """A failed-sync record read: nothing, or one whose lines are made."""
    failure = parse_failed_sync(data)
    if failure is not None:
        failure.describe()
        failure.made_up()


def check_index_entry(data: bytes) -> None:
    """An entry of the index of runs read: nothing, or one naming its log."""
    entry = parse_index_entry(data)
    if entry is not None:
        assert isinstance(entry["log"], str)
        followers(entry)
        entry_kernels(entry)
