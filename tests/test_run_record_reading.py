"""Run logs read back: damaged lines skipped with a warning, the status of a run without an
end, the index, and ``ipycloud runs`` in a terminal. The logs are written here by hand, as
a process killed mid-write or another machine would leave them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest

import ipycloud
from ipycloud.cli import main
from ipycloud.runtime.runs import (
    RunRecordWarning,
    UnknownRunError,
    log_reader,
    read_run,
    records,
    runs,
)
from ipycloud.runtime.runs.log_reader import LogReader
from ipycloud.runtime.runs.polled_logs import PolledLog
from ipycloud.runtime.runs.records import RECORD_FOLDER
from ipycloud.runtime.runs.summary import STALE_S, RunState, summarize

RUN, OTHER = "a1b2c3d4e5f6", "0123456789ab"
T0 = 1_700_000_000.0


def start(**fields: Any) -> dict[str, Any]:
    return {"t": T0, "kind": "start", "run": RUN, "pid": os.getpid(),
            "host": socket.gethostname(), "process_started": psutil.Process().create_time(),
            "kernel": None, "notebook": "train.ipynb", "folder": "/ck", "device": "cpu",
            "model": "Net", "step": 0, "epoch": 0, "total_steps": 40, "epochs": 2,
            "session_left_s": None, **fields}


def step(number: int, t: float, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": number, "epoch": number // 20, "loss": 1 / number,
            "lr": 0.1, "steps_per_s": 2.0, "samples_per_s": 16.0, **fields}


def end(status: str, at: int, t: float = T0 + 30) -> dict[str, Any]:
    return {"t": t, "kind": "end", "status": status, "reason": None, "step": at, "epoch": 1,
            "best": None}


def write_log(folder: Path, lines: list[Any], run: str = RUN, tail: bytes = b"") -> Path:
    log = folder / RECORD_FOLDER / f"{run}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"".join((json.dumps(line).encode() if isinstance(line, dict) else line)
                             + b"\n" for line in lines) + tail)
    return log


def test_a_line_cut_short_by_a_kill_is_skipped_with_a_warning(tmp_path: Path) -> None:
    write_log(tmp_path, [start(pid=2**22 + 1), step(2, T0 + 1), step(4, T0 + 2)],
              tail=b'{"t": 1700000003.0, "kind": "step", "st')

    with pytest.warns(RunRecordWarning, match="its last line, cut short, is not a record"):
        [run] = runs(tmp_path)
    assert (run.status, run.step, [row["step"] for row in run.steps]) == ("lost", 4, [2, 4])


@pytest.mark.parametrize("damaged", [b"\x00\x00garbage", b'{"t": "soon", "kind": "step"}',
                                     b'{"t": 1.0, "kind": "step", "step": "two"}', b"[1, 2]"],
                         ids=["bytes", "a time that is not one", "a step that is not one",
                              "not an object"])
def test_a_damaged_line_in_the_middle_is_skipped_with_a_warning(
        tmp_path: Path, damaged: bytes) -> None:
    write_log(tmp_path, [start(), step(2, T0 + 1), damaged, step(4, T0 + 2), end("finished", 4)])

    with pytest.warns(RunRecordWarning, match="line 3 is not a record; skipped"):
        [run] = runs(tmp_path)
    assert (run.status, [row["step"] for row in run.steps]) == ("finished", [2, 4])


def test_a_log_read_again_gives_what_was_appended_and_a_rewritten_one_afresh(
        tmp_path: Path) -> None:
    log = write_log(tmp_path, [start(), step(2, T0 + 1)], tail=b'{"t": 1700000002.0, "ki')
    with pytest.warns(RunRecordWarning, match="cut short"):
        assert [row["step"] for row in read_run(log)[0].steps] == [2]

    with open(log, "ab") as file:  # the writer finishes its line, and writes another
        file.write(b'nd": "step", "step": 4}\n' + json.dumps(step(6, T0 + 3)).encode() + b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [row["step"] for row in read_run(log)[0].steps] == [2, 4, 6]

    write_log(tmp_path, [start(), step(8, T0 + 1)])  # the same file, rewritten shorter
    assert [row["step"] for row in read_run(log)[0].steps] == [8]
    other = write_log(tmp_path / "elsewhere", [start(), *(
        step(number, T0 + number) for number in range(10, 20))])
    os.replace(other, log)  # another file in its place, longer
    assert [row["step"] for row in read_run(log)[0].steps] == list(range(10, 20))


def test_the_records_read_so_far_are_given_at_once_while_a_long_read_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A huge log takes seconds to read; a front asking for the records after a time
    meanwhile gets those of the chunks already read, without waiting for the read."""
    monkeypatch.setattr(records, "CHUNK_BYTES", 4096)
    log = write_log(tmp_path, [start(), *(step(number, T0 + number) for number in range(1, 400))])
    reader = LogReader(log)
    halfway, go_on = threading.Event(), threading.Event()
    add = RunState.add

    def slow_add(state: RunState, record: dict[str, Any]) -> None:
        if record.get("step") == 300:
            halfway.set()
            go_on.wait(60)
        add(state, record)

    monkeypatch.setattr(RunState, "add", slow_add)
    reading = threading.Thread(target=reader.read)
    reading.start()
    assert halfway.wait(60)
    answers: list[list[dict[str, Any]]] = []
    asking = threading.Thread(target=lambda: answers.append(reader.records_after(T0 + 100)))
    asking.start()
    asking.join(10)
    answered_during_the_read = len(answers) == 1
    go_on.set()
    reading.join()
    asking.join()
    assert answered_during_the_read
    steps = [record["step"] for record in answers[0]]
    assert steps == list(range(101, 101 + len(steps))) and 101 < steps[-1] < 300


def test_a_followed_log_is_read_in_small_chunks_with_a_pause_after_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's or a kernel's follower lets the process's other threads in while it
    reads a long log: the same records as a plain read, taken a small chunk at a time."""
    log = write_log(tmp_path, [start(), *(step(number, T0 + number) for number in range(1, 400))])
    pauses: list[float] = []
    monkeypatch.setattr(log_reader.time, "sleep", pauses.append)
    followed = PolledLog(log)
    assert followed.look()
    chunks = -(-log.stat().st_size // log_reader.BACKGROUND_CHUNK_BYTES)
    assert chunks > 3 and pauses == [log_reader.BACKGROUND_PAUSE_S] * (chunks - 1)
    pauses.clear()
    plain = LogReader(log)
    plain.read()
    assert pauses == [] and followed.reader.records() == plain.records()
    assert followed.records_after(None) == plain.records_after(None)


@pytest.mark.parametrize("status", ["finished", "failed", "paused", "stopped early"])
def test_a_run_with_an_end_has_its_status(tmp_path: Path, status: str) -> None:
    write_log(tmp_path, [start(), step(2, T0 + 1), end(status, 2)])
    [run] = runs(tmp_path)
    assert (run.status, run.eta_s) == (status, None)


def test_a_run_without_an_end_is_running_while_its_process_lives(tmp_path: Path) -> None:
    log = write_log(tmp_path, [start(session_left_s=3600.0), *(
        step(number, T0 + number) for number in range(2, 14, 2))])

    [run] = runs(tmp_path)
    assert run.status == "running"
    assert run.steps_per_s == pytest.approx(1.0)  # 10 steps in 10 s
    assert run.eta_s == pytest.approx(40 - 12)
    summary = summarize(log, read_run(log)[1], now=T0 + 100)
    assert summary.session_left_s == pytest.approx(3500.0)


def test_a_run_whose_process_is_gone_is_lost(tmp_path: Path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    write_log(tmp_path, [start(pid=int(ended.stdout)), step(2, T0 + 1)])
    [run] = runs(tmp_path)
    assert (run.status, run.eta_s, run.session_left_s) == ("lost", None, None)


def test_a_reused_process_id_does_not_keep_a_run_alive(tmp_path: Path) -> None:
    write_log(tmp_path, [start(process_started=psutil.Process().create_time() - 3600)])
    [run] = runs(tmp_path)
    assert run.status == "lost"


def test_a_run_on_another_machine_is_lost_once_its_log_is_stale(tmp_path: Path) -> None:
    log = write_log(tmp_path, [start(host="elsewhere"), step(2, T0 + 1)])
    lines = read_run(log)[1]
    assert summarize(log, lines, now=T0 + 1 + STALE_S - 1).status == "running"
    assert summarize(log, lines, now=T0 + 1 + STALE_S + 1).status == "lost"


def test_a_resumed_run_keeps_the_steps_it_redid_once(tmp_path: Path) -> None:
    write_log(tmp_path, [start(pid=2**22 + 1), step(2, T0 + 1), step(4, T0 + 2), step(6, T0 + 3),
                         start(t=T0 + 10, step=4), step(6, T0 + 11), end("finished", 6)])
    [run] = runs(tmp_path)
    assert [(row["step"], row["t"]) for row in run.steps] == [
        (2, T0 + 1), (4, T0 + 2), (6, T0 + 11)]
    assert (run.status, run.started, run.updated) == ("finished", T0, T0 + 30)


def test_runs_are_listed_newest_first_and_read_since_a_time(tmp_path: Path) -> None:
    write_log(tmp_path, [start(), end("finished", 0, t=T0 + 5)], run=RUN)
    log = write_log(tmp_path, [start(run=OTHER), step(2, T0 + 6), end("failed", 2, t=T0 + 9)],
                    run=OTHER)
    assert [run.id for run in runs(tmp_path)] == [OTHER, RUN]
    assert [run.id for run in runs(tmp_path / RECORD_FOLDER)] == [OTHER, RUN]
    run, newer = read_run(log, since=T0 + 6)
    assert run.id == OTHER and [line["kind"] for line in newer] == ["end"]


def test_runs_with_no_folder_are_those_of_the_index(tmp_path: Path, state_home: Path) -> None:
    log = write_log(tmp_path / "ck", [start(), end("finished", 0)])
    index = state_home / "runs" / "index"
    index.mkdir(parents=True)
    (index / f"{RUN}.json").write_text(json.dumps({"run": RUN, "log": str(log)}))
    (index / f"{OTHER}.json").write_text(json.dumps({"run": OTHER, "log": "/gone.jsonl"}))
    (index / "junk.json").write_text("{")

    assert [run.id for run in ipycloud.runs()] == [RUN]
    assert read_run(RUN)[0].log == log
    with pytest.raises(UnknownRunError, match=f"no run {OTHER} here"):
        read_run(OTHER)


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_path_that_is_not_a_folder_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "it's here"
    if kind == "a file":
        path.write_text("")
    with pytest.raises(OSError, match="give a checkpoint folder") as raised:
        runs(path)
    assert "\n" not in str(raised.value)


def test_the_cli_shows_the_runs_as_a_table_and_as_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "check 'points'"
    write_log(folder, [start(), step(2, T0 + 1), step(20, T0 + 10), {
        "t": T0 + 11, "kind": "epoch", "epoch": 0, "val_loss": 0.25}, {
        "t": T0 + 12, "kind": "event", "event": "early_stop", "message": "no better"}, {
        **end("stopped early", 20), "best": {"metric": "val_loss", "value": 0.25, "epoch": 0}}])

    assert main(["runs", str(folder)]) == 0
    title, header, row = capsys.readouterr().out.splitlines()
    assert title == f"1 run in {folder}"
    assert header.split() == ["run", "status", "notebook", "step", "epoch", "loss", "steps/s",
                              "eta", "best", "events", "updated"]
    assert row.startswith(f"{RUN}  stopped early  train.ipynb  20/40  1/2    0.05  2   ")
    assert "val_loss 0.25 (epoch 0)  1 " in row

    assert main(["runs", str(folder), "--json"]) == 0
    [summary] = json.loads(capsys.readouterr().out)["runs"]
    assert {key: summary[key] for key in ("id", "status", "step", "total_steps", "epoch",
                                          "epochs", "events", "checkpoints", "last_loss")} == {
        "id": RUN, "status": "stopped early", "step": 20, "total_steps": 40, "epoch": 1,
        "epochs": 2, "events": 1, "checkpoints": 0, "last_loss": 0.05}

    empty = tmp_path / "no runs 'yet'"
    empty.mkdir()
    assert main(["runs", str(empty)]) == 0
    assert capsys.readouterr().out == f"no runs in {empty}\n"  # no empty table

    assert main(["runs", str(tmp_path / "nowhere")]) == 1
    assert capsys.readouterr().err == (f"ipycloud runs: no folder "
                                       f"{str(tmp_path / 'nowhere')!r}: give a checkpoint "
                                       "folder (fit's checkpoint=)\n")
