"""Every reader of a file that a user or another process can write, given any input: run
records (lines of any bytes), whole logs, the index of runs, checkpoint manifests, folder
leases, partial-download metadata and failed-sync records. None raises, none gives back
more than its input bounds, and what goes out as JSON is strict. Generated with
Hypothesis (a modest number of examples here; benchmarks/readers_fuzz.py runs each on
100,000 and more), with the inputs that broke them before as explicit examples; then the
same readers on real files, a FIFO and a symlink among them."""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

from api_schema import check
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from readers_inputs import (
    FAILED_SYNC,
    INDEX_ENTRY,
    LEASE,
    LOGS,
    MANIFEST,
    PART_META,
    RECORD,
    RECORD_LINES,
    check_failed_sync,
    check_index_entry,
    check_lease,
    check_log_lines,
    check_manifest,
    check_part_meta,
    check_record_line,
    dumped,
    file_contents,
)

from ipycloud.runtime.checkpoint.catalog import read_catalog
from ipycloud.runtime.checkpoint.leases import live_elsewhere
from ipycloud.runtime.runs import RunRecordWarning, runs
from ipycloud.runtime.runs.records import RECORD_FOLDER
from ipycloud.runtime.storage.failed_syncs import failed_syncs
from ipycloud.runtime.storage.partial import PartFile

EXAMPLES = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
DEEP = b"[" * 100_000 + b"]" * 100_000
WAIT_S = 60.0  # for a reader that must not block


def quietly(check: Callable[..., None], *args: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunRecordWarning)
        check(*args)


@EXAMPLES
@given(RECORD_LINES)
@example(DEEP)
@example(b'{"t": ' + b"9" * 400 + b', "kind": "step", "step": 1}')
@example(b'{"t": 1e300, "kind": "step", "step": 1}')
@example(b'{"t": 1700000000, "kind": "step", "step": ' + b"9" * 400 + b"}")
@example(b'{"t": 1700000000, "kind": "event", "message": "\\ud800", "x": NaN}')
def test_a_record_line_of_any_bytes(line: bytes) -> None:
    check_record_line(line)


@EXAMPLES
@given(LOGS)
@example([b'{"t": 1700000000, "kind": "start", "step": 0, "epoch": 0, "total_steps": "x", '
          b'"epochs": [1], "pid": 1e300, "host": 5, "session_left_s": 1e300}',
          b'{"t": 1700000001, "kind": "step", "step": 1, "steps_per_s": 1e-300}',
          b'{"t": 1700000002, "kind": "end", "status": "finished", "step": 1, "epoch": 0, '
          b'"best": {"value": NaN, "epoch": "x"}, "reason": {"a": 1}}'])
def test_a_log_of_any_lines(lines: list[bytes]) -> None:
    quietly(check_log_lines, lines)


@EXAMPLES
@given(file_contents(INDEX_ENTRY))
@example(DEEP)
@example(json.dumps({"log": "/a\x00b"}).encode())
def test_an_index_entry_of_any_bytes(data: bytes) -> None:
    check_index_entry(data)


@EXAMPLES
@given(file_contents(MANIFEST))
@example(DEEP)
@example(json.dumps({**MANIFEST, "time": float("inf")}).encode())
@example(json.dumps({**MANIFEST, "time": 1e300}).encode())
@example(json.dumps({**MANIFEST, "time": None}).encode())
@example(json.dumps({**MANIFEST, "metrics": {"val_loss": float("nan")}}).encode())
@example(json.dumps({**MANIFEST, "keep_best": ["val_loss", "min", 10**400]}).encode())
def test_a_manifest_of_any_bytes(data: bytes) -> None:
    check_manifest(data)


@EXAMPLES
@given(file_contents(LEASE))
@example(DEEP)
@example(json.dumps({**LEASE, "pid": 10**30}).encode())
def test_a_lease_of_any_bytes(data: bytes) -> None:
    check_lease(data)


@EXAMPLES
@given(file_contents(PART_META))
@example(DEEP)
@example(json.dumps({**PART_META, "etag": '"a"\r\nX-Forged: 1'}).encode())
def test_partial_download_metadata_of_any_bytes(data: bytes) -> None:
    check_part_meta(data)


@EXAMPLES
@given(file_contents(FAILED_SYNC))
@example(DEEP)
@example(json.dumps({**FAILED_SYNC, "time": "nan"}).encode())
@example(json.dumps({**FAILED_SYNC, "time": 1e300}).encode())
def test_a_failed_sync_record_of_any_bytes(data: bytes) -> None:
    check_failed_sync(data)


# -- the same readers on files ------------------------------------------------------------


def plant(folder: Path, name: str, data: bytes | None) -> Path:
    """The file ``name`` in ``folder`` holding ``data``; None: a FIFO in its place."""
    path = folder / name
    folder.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if data is None:
        os.mkfifo(path)
    else:
        path.write_bytes(data)
    return path


def without_blocking(read: Callable[[], object]) -> object:
    """What ``read`` gives; fails where it waits on a FIFO."""
    found: list[object] = []
    reader = threading.Thread(target=lambda: found.append(read()), daemon=True)
    reader.start()
    reader.join(WAIT_S)
    assert not reader.is_alive(), "a reader blocked on a FIFO"
    return found[0]


FILES_OR_FIFOS = st.one_of(st.none(), st.binary(max_size=300))


@EXAMPLES
@given(file_contents(MANIFEST) | FILES_OR_FIFOS)
def test_a_checkpoint_folder_with_any_manifest_is_listed(tmp_path: Path,
                                                        data: bytes | None) -> None:
    plant(tmp_path, "step-000000001.json", data)

    infos, unreadable = without_blocking(lambda: read_catalog(tmp_path))  # type: ignore[misc]
    assert len(infos) + len(unreadable) == 1


@EXAMPLES
@given(file_contents(LEASE) | FILES_OR_FIFOS)
def test_a_folder_with_any_lease_is_read(tmp_path: Path, data: bytes | None) -> None:
    plant(tmp_path, ".ipycloud-run-a1b2c3d4e5f6.json", data)

    assert without_blocking(lambda: live_elsewhere(tmp_path)) == {}


@EXAMPLES
@given(file_contents(PART_META) | FILES_OR_FIFOS)
def test_any_partial_download_metadata_is_read(tmp_path: Path, data: bytes | None) -> None:
    plant(tmp_path, "data.bin.part.meta", data)

    without_blocking(lambda: PartFile(tmp_path, "data.bin").validators())


@EXAMPLES
@given(file_contents(FAILED_SYNC) | FILES_OR_FIFOS)
def test_any_failed_sync_record_is_read(state_home: Path, data: bytes | None) -> None:
    plant(state_home / "failed-syncs", "0" * 32 + ".json", data)

    for failure in without_blocking(failed_syncs):  # type: ignore[attr-defined]
        failure.describe()


@settings(EXAMPLES, max_examples=30)
@given(LOGS, st.sampled_from(["file", "fifo", "symlink"]))
@example([dumped({**RECORD, "kind": "start", "notebook": 5, "pid": "1", "model": [1]}),
          dumped({**RECORD, "kind": "end", "best": {"metric": 1, "value": "low"}})], "file")
def test_a_folder_with_any_log_is_listed(tmp_path: Path, lines: list[bytes],
                                         kind: str) -> None:
    logs = tmp_path / RECORD_FOLDER
    log = plant(logs, "a1b2c3d4e5f6.jsonl", None if kind == "fifo" else b"\n".join(lines))
    if kind == "symlink":
        log.rename(tmp_path / "outside.jsonl")
        log.symlink_to(tmp_path / "outside.jsonl")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunRecordWarning)
        listed = without_blocking(lambda: runs(tmp_path))
    for run in listed:  # type: ignore[attr-defined]
        check("run-summary.json", json.loads(json.dumps(run.to_json(), allow_nan=False)))
    if kind != "file":
        assert listed == []
