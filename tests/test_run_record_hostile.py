"""Run logs that other processes or people wrote, read without trusting them: one hostile
line never breaks a reader (nor the index of runs, nor ``ipycloud runs --json``), a log cut
and written again on the same inode is read afresh, a symlink or a FIFO is never read
through, and a long log is summed up in bounded memory. The logs are written here by hand,
as a corrupt disk, another program or a person would leave them."""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from strict_json import loads

from ipycloud.cli import main
from ipycloud.runtime.runs import RunRecordWarning, log_reader, runs
from ipycloud.runtime.runs.polled_logs import PolledLog
from ipycloud.runtime.runs.records import RECORD_FOLDER, index_dir
from ipycloud.runtime.runs.run_watch import RunWatch
from ipycloud.runtime.runs.summary import MAX_STEP_ROWS
from ipycloud.runtime.untrusted import open_regular

RUN, OTHER = "a1b2c3d4e5f6", "0123456789ab"
T0 = 1_700_000_000.0
WAIT_S = 60.0  # for a reader that must not block


def start(**fields: Any) -> dict[str, Any]:
    return {"t": T0, "kind": "start", "run": RUN, "pid": 2**22 + 1, "host": "elsewhere",
            "notebook": "train.ipynb", "step": 0, "epoch": 0, "total_steps": 40, "epochs": 2,
            **fields}


def step(number: int, t: float, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": number, "epoch": 0, "loss": 1 / number, **fields}


def end(at: int) -> dict[str, Any]:
    return {"t": T0 + 30, "kind": "end", "status": "finished", "reason": None, "step": at,
            "epoch": 1, "best": None}


def lines_of(records: list[Any]) -> bytes:
    return b"".join((json.dumps(line).encode() if isinstance(line, dict) else line) + b"\n"
                    for line in records)


def write_log(folder: Path, records: list[Any], run: str = RUN) -> Path:
    log = folder / RECORD_FOLDER / f"{run}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(lines_of(records))
    return log


def cli(*words: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(words))
    return status, out.getvalue(), err.getvalue()


HOSTILE = {
    "a 100,000-deep array": b"[" * 100_000 + b"]" * 100_000,
    "a 100,000-deep object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "a 400-digit t": b'{"t": ' + b"9" * 400 + b', "kind": "step", "step": 3}',
    "a 400-digit step": b'{"t": 1700000002.5, "kind": "step", "step": ' + b"9" * 400 + b"}",
    "a 5000-digit step": b'{"t": 1700000002.5, "kind": "step", "step": ' + b"9" * 5000 + b"}",
    "t 1e300": b'{"t": 1e300, "kind": "step", "step": 3}',
    "t 1e400": b'{"t": 1e400, "kind": "step", "step": 3}',
    "t Infinity": b'{"t": Infinity, "kind": "step", "step": 3}',
    "t NaN": b'{"t": NaN, "kind": "step", "step": 3}',
    "a negative t": b'{"t": -5, "kind": "step", "step": 3}',
    "invalid UTF-8": b'{"t": 1700000002.5, "kind": "event", "message": "\xff\xfe"}',
    "a NUL byte": b'{"t": 1700000002.5, "kind": "st\x00ep", "step": 3}',
    "a line of 3 MB": b'{"t": 1700000002.5, "kind": "event", "message": "' + b"x" * 3_000_000
                      + b'"}',
}


@pytest.mark.parametrize("hostile", HOSTILE.values(), ids=HOSTILE.keys())
def test_one_hostile_line_is_skipped_with_one_warning(tmp_path: Path, hostile: bytes) -> None:
    write_log(tmp_path, [start(), step(2, T0 + 1), hostile, step(4, T0 + 2), end(4)])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        [run] = runs(tmp_path)
    told = [str(warning.message) for warning in caught
            if issubclass(warning.category, RunRecordWarning)]
    assert len(told) == 1 and "line 3" in told[0]
    assert (run.status, run.step, [row["step"] for row in run.steps]) == ("finished", 4, [2, 4])


@pytest.mark.parametrize("hostile", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_index_of_runs_survives_a_hostile_line_in_any_log(tmp_path: Path,
                                                             hostile: bytes) -> None:
    good = write_log(tmp_path / "good", [start(run=OTHER), step(2, T0 + 1), end(2)], OTHER)
    bad = write_log(tmp_path / "bad", [start(), hostile, step(4, T0 + 2)])
    index_dir().mkdir(parents=True)
    for run, log in ((OTHER, good), (RUN, bad)):
        (index_dir() / f"{run}.json").write_text(json.dumps({"run": run, "log": str(log)}))

    status, out, err = cli("runs")
    assert status == 0, err
    assert "2 runs on this machine" in out and RUN in out and OTHER in out
    status, out, err = cli("runs", "--json")
    assert status == 0, err
    assert {run["id"] for run in loads(out)["runs"]} == {RUN, OTHER}


def test_text_with_a_lone_surrogate_is_printable(tmp_path: Path) -> None:
    write_log(tmp_path, [b'{"t": 1700000000, "kind": "start", "step": 0, "epoch": 0, '
                         b'"notebook": "a\\ud800b.ipynb"}', end(0)])

    [run] = runs(tmp_path)
    assert run.start["notebook"].encode() == "a\ufffdb.ipynb".encode()
    status, out, err = cli("runs", str(tmp_path))
    assert status == 0, err
    assert "a\ufffdb.ipynb" in out


def test_a_hostile_index_entry_is_left_out(tmp_path: Path) -> None:
    log = write_log(tmp_path, [start(), step(2, T0 + 1), end(2)])
    index_dir().mkdir(parents=True)
    (index_dir() / f"{RUN}.json").write_text(json.dumps({"run": RUN, "log": str(log)}))
    (index_dir() / "deep.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    (index_dir() / "nul.json").write_text(json.dumps({"run": OTHER, "log": "/tmp/a\x00b"}))
    (index_dir() / "number.json").write_text('{"run": 1, "log": 5}')
    (index_dir() / "huge.json").write_bytes(b'{"log": "' + b"x" * 3_000_000 + b'"}')

    status, out, err = cli("runs")
    assert status == 0, err
    assert "1 run on this machine" in out and RUN in out


def test_a_fifo_in_the_index_or_among_the_logs_never_blocks_the_listing(tmp_path: Path) -> None:
    write_log(tmp_path, [start(), step(2, T0 + 1), end(2)])
    os.mkfifo(tmp_path / RECORD_FOLDER / f"{OTHER}.jsonl")
    index_dir().mkdir(parents=True)
    os.mkfifo(index_dir() / f"{OTHER}.json")
    (index_dir() / f"{RUN}.json").write_text(
        json.dumps({"run": RUN, "log": str(tmp_path / RECORD_FOLDER / f"{OTHER}.jsonl")}))
    found: dict[str, list[Any]] = {}

    def listing() -> None:
        found["folder"] = runs(tmp_path)
        found["index"] = runs()

    reader = threading.Thread(target=listing, daemon=True)
    reader.start()
    reader.join(WAIT_S)
    assert not reader.is_alive(), "a reader blocked on a FIFO"
    assert [run.id for run in found["folder"]] == [RUN] and found["index"] == []


def test_the_safe_open_refuses_a_fifo_a_symlink_and_a_folder_without_blocking(
        tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "target").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "folder").mkdir()

    for name in ("fifo", "link", "folder"):
        with pytest.raises(OSError, match=r"not a regular file|symbolic link"):
            open_regular(tmp_path / name)
    fd = open_regular(tmp_path / "target")
    try:
        assert os.read(fd, 10) == b"{}"
    finally:
        os.close(fd)


def read_log(log: Path, last: PolledLog | None = None) -> PolledLog | None:
    """``log`` followed, as a front polling it does: looked at again (``last``) or
    for the first time; None where it cannot be read."""
    followed = last or PolledLog(log)
    return followed if followed.look() else None


def test_a_log_symlinked_out_of_its_folder_is_not_read(tmp_path: Path) -> None:
    outside = write_log(tmp_path / "outside", [start(), step(2, T0 + 1), end(2)])
    folder = tmp_path / "ck" / RECORD_FOLDER
    folder.mkdir(parents=True)
    (folder / f"{RUN}.jsonl").symlink_to(outside)

    assert runs(tmp_path / "ck") == []
    assert read_log(folder / f"{RUN}.jsonl") is None


def test_nan_and_infinity_are_null_in_the_json_of_runs(tmp_path: Path) -> None:
    write_log(tmp_path, [start(watch={"metric": "val_loss", "mode": "min"}),
                         b'{"t": 1700000001, "kind": "step", "step": 2, "loss": NaN, '
                         b'"steps_per_s": Infinity}',
                         b'{"t": 1700000002, "kind": "epoch", "epoch": 0, "val_loss": -Infinity}',
                         b'{"t": 1700000003, "kind": "end", "status": "finished", "step": 2, '
                         b'"epoch": 1, "best": {"metric": "val_loss", "value": NaN}}'])

    status, out, err = cli("runs", str(tmp_path), "--json")
    assert status == 0, err
    [run] = loads(out)["runs"]
    # A best whose value is no number is no best: the summary's schema gives best as null
    # or a metric with its finite value, and the fronts show nothing for it.
    assert (run["last_loss"], run["best"]) == (None, None)
    assert "NaN" not in out and "Infinity" not in out


def test_a_log_cut_and_written_again_on_the_same_inode_is_read_afresh(tmp_path: Path) -> None:
    first = [start(), *(step(number, T0 + number) for number in range(1, 31))]
    log = write_log(tmp_path, first)
    inode = log.stat().st_ino
    followed = read_log(log)
    assert followed is not None and followed.summary["step"] == 30
    # Another run's log takes its place in the same file, longer than the first.
    second = [start(total_steps=90, notebook="other.ipynb"),
              *(step(number, T0 + 100 + number, loss=5.0) for number in range(1, 61))]
    with open(log, "r+b") as file:
        file.truncate(0)
        file.write(lines_of(second))
    assert log.stat().st_ino == inode

    again = read_log(log, followed)
    assert again is not None
    assert (again.summary["step"], again.summary["total_steps"], again.summary["notebook"]) == (
        60, 90, "other.ipynb")
    assert [line["step"] for line in again.records_after(None) if line["kind"] == "step"] == list(
        range(1, 61))


def test_a_log_written_again_in_place_past_its_first_bytes_is_read_afresh(
        tmp_path: Path) -> None:
    """The same first lines (more than the 4 KiB compared at its start), then others where
    the last look ended: the log is read afresh, not as a mix of both."""
    same_start = [start(), *(step(number, T0 + number) for number in range(1, 101))]
    log = write_log(tmp_path, [*same_start, *(step(number, T0 + number, loss=1.0)
                                              for number in range(101, 151))])
    followed = read_log(log)
    assert followed is not None and followed.summary["step"] == 150
    with open(log, "r+b") as file:
        file.truncate(0)
        file.write(lines_of([*same_start, *(step(number, T0 + number, loss=2.0)
                                            for number in range(101, 181))]))

    again = read_log(log, followed)
    assert again is not None and again.summary["step"] == 180
    losses = [line["loss"] for line in again.records_after(T0 + 100)]
    assert losses == [2.0] * 80


def test_a_log_cut_shorter_on_the_same_inode_is_read_afresh(tmp_path: Path) -> None:
    log = write_log(tmp_path, [start(), *(step(number, T0 + number) for number in range(1, 31))])
    followed = read_log(log)
    with open(log, "r+b") as file:
        file.truncate(0)
        file.write(lines_of([start(notebook="short.ipynb"), step(1, T0 + 1)]))

    again = read_log(log, followed)
    assert again is not None and (again.summary["step"], again.summary["notebook"]) == (
        1, "short.ipynb")


def told(caught: list[warnings.WarningMessage]) -> list[str]:
    return sorted(str(warning.message) for warning in caught
                  if issubclass(warning.category, RunRecordWarning))


def test_a_damaged_line_warns_once_however_often_the_log_is_read(tmp_path: Path) -> None:
    log = write_log(tmp_path, [start(), step(2, T0 + 1), b"garbage"])
    with open(log, "ab") as file:
        file.write(b'{"t": 1700000003.0, "kind": "st')  # a last line cut short

    with warnings.catch_warnings(record=True) as listed:
        warnings.simplefilter("always")
        for _ in range(3):
            runs(tmp_path)
    assert len(told(listed)) == 2, told(listed)
    assert "cut short" in told(listed)[0] and "line 3 is not a record" in told(listed)[1]

    with warnings.catch_warnings(record=True) as followed:
        warnings.simplefilter("always")
        last = read_log(log)
        for number in range(5, 8):  # the writer begins afresh below the line cut short
            with open(log, "ab") as file:
                file.write(b"\n" + lines_of([step(number, T0 + number)]))
            last = read_log(log, last)
    assert last is not None and last.summary["step"] == 7
    assert len(told(followed)) == 2, told(followed)
    assert "line 3 is not a record" in told(followed)[0]
    assert "line 4 is not a record" in told(followed)[1]  # the one cut short


def test_a_long_log_is_summed_up_from_a_bounded_number_of_rows(tmp_path: Path) -> None:
    count = 10_000
    log = tmp_path / RECORD_FOLDER / f"{RUN}.jsonl"
    log.parent.mkdir()
    with open(log, "wb") as file:
        file.write(lines_of([start(total_steps=count)]))
        file.write(b"".join(b'{"t":%.1f,"kind":"step","step":%d,"epoch":0,"loss":%d}\n'
                            % (T0 + number / 10, number, number) for number in
                            range(1, count + 1)))

    [run] = runs(tmp_path)
    assert (run.step, run.last_loss, run.steps_per_s) == (count, count, 10.0)
    assert len(run.steps) <= MAX_STEP_ROWS
    assert run.steps[0]["step"] == 1 and run.steps[-1]["step"] == count
    followed = read_log(log)
    assert followed is not None and len(followed.reader.records()) <= MAX_STEP_ROWS + 1


def test_runs_of_a_parent_folder_are_found_in_its_subfolders(tmp_path: Path) -> None:
    write_log(tmp_path / "projects" / "a" / "ck", [start(), step(2, T0 + 1), end(2)])
    write_log(tmp_path / "projects" / "b", [start(run=OTHER), step(2, T0 + 5), end(2)], OTHER)
    (tmp_path / "projects" / "loop").symlink_to(tmp_path / "projects")

    status, out, err = cli("runs", str(tmp_path / "projects"))
    assert status == 0, err
    assert "2 runs under" in out and RUN in out and OTHER in out
    assert "a/ck" in out  # where each run lies
    assert {run.id for run in runs(tmp_path / "projects")} == {RUN, OTHER}


def test_following_a_fast_log_hands_on_a_bounded_number_of_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_reader, "MAX_APPENDED", 100)
    log = write_log(tmp_path, [start(total_steps=10**6),
                               *(step(number, T0 + number / 100) for number in range(1, 5001))])
    watch = RunWatch(log)

    first = watch.look()
    assert (len(first.appended), first.renewed, watch.summary.step) == (100, True, 5000)
    with open(log, "ab") as file:  # fewer than a look hands on: they come as they are
        file.write(lines_of([step(number, T0 + number / 100) for number in range(5001, 5011)]))
    more = watch.look()
    assert ([line["step"] for line in more.appended], more.renewed) == (
        list(range(5001, 5011)), False)
    with open(log, "ab") as file:  # more: the view is built again from the summary's rows
        file.write(lines_of([step(number, T0 + number / 100) for number in range(5011, 5500)]))
    burst = watch.look()
    assert (len(burst.appended), burst.renewed, burst.appended[-1]["step"]) == (100, True, 5499)
    assert len(watch.summary.steps) <= MAX_STEP_ROWS
