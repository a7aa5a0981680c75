"""Following a run from its record: the progress lines of a run that fails on one host and
goes on on another, an interrupt that stops the following and not the run, a record that
cannot be read for a while (a real failing mount), the mistakes a caller can make, the
index of runs, and ``ipycloud runs FOLDER --follow`` in a real process.

The logs are written here as the nodes of a cluster would write them (another host); each
pause between two looks at the record appends what the run wrote meanwhile.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faultfs import FaultyMount
from recent import now, recent_time  # noqa: F401 (recent_time: an autouse fixture)

from ipycloud.cli import main
from ipycloud.runtime.runs import UnknownRunError, records
from ipycloud.runtime.runs.follow_run import FollowStopped, TextView, follow_run
from ipycloud.runtime.runs.records import RECORD_FOLDER
from ipycloud.runtime.runs.summary import RunSummary

RUN, OTHER = "a1b2c3d4e5f6", "0123456789ab"
T = now()  # set again for each test (recent_time): runs elsewhere are fresh for 10 minutes


def at(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def start(t: float, host: str, pid: int, step: int = 0, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": "start", "run": RUN, "pid": pid, "host": host, "kernel": None,
            "notebook": "train.py", "step": step, "epoch": 0, "total_steps": 40, "epochs": 2,
            **fields}


def step(number: int, t: float) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": number, "epoch": number // 20, "loss": 1 / number}


def end(status: str, t: float, at_step: int, reason: str | None = None) -> dict[str, Any]:
    return {"t": t, "kind": "end", "status": status, "reason": reason, "step": at_step,
            "epoch": at_step // 20, "best": None}


def log_of(folder: Path, run: str = RUN) -> Path:
    return folder / RECORD_FOLDER / f"{run}.jsonl"


def append(log: Path, *lines: dict[str, Any]) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as file:
        file.write("".join(json.dumps(line) + "\n" for line in lines))


class Meanwhile:
    """The pauses of ``follow_run``: each appends the next lines the run wrote (or does
    what it is given) and moves the clock of the TextView on."""

    def __init__(self, log: Path, *chunks: list[dict[str, Any]] | Callable[[], object],
                 seconds: list[float] | None = None) -> None:
        self.log, self.chunks = log, list(chunks)
        self.seconds = seconds or [1.0] * len(chunks)
        self.now = 0.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, pause: float) -> None:
        assert self.chunks, "followed past the end of the run"
        self.pauses.append(pause)
        self.now += self.seconds.pop(0)
        chunk = self.chunks.pop(0)
        if callable(chunk):
            chunk()
        else:
            append(self.log, *chunk)


def follow_in_text(folder: Path, meanwhile: Meanwhile, run: str | None = None,
                   cpu_per_look: float = 0.001) -> tuple[RunSummary, list[str]]:
    out = io.StringIO()
    cpu = iter(range(10_000))
    summary = follow_run(folder, run, view=TextView(out, clock=meanwhile.clock),
                         sleep=meanwhile, cpu_clock=lambda: next(cpu) * cpu_per_look)
    return summary, out.getvalue().splitlines()


def test_a_run_that_fails_on_one_host_and_goes_on_on_another_is_followed_to_its_end(
        tmp_path: Path) -> None:
    folder = tmp_path / "bucket 'ck'"
    log = log_of(folder)
    append(log, start(T, "node-a", 5, restarts={"count": 0, "max": 2}), step(2, T + 1),
           step(4, T + 2))
    epoch = {"t": T + 4, "kind": "epoch", "epoch": 0, "steps": 6, "train_loss": 0.9,
             "val_loss": 0.5, "seconds": 3.0}
    meanwhile = Meanwhile(
        log, [step(6, T + 3), epoch], [end("failed", T + 5, 6, "RuntimeError: peer gone")],
        [start(T + 9, "node-b", 7, step=4, restarts={"count": 1, "max": 2}),
         {"t": T + 9, "kind": "event", "event": "resume", "message": "resuming from step 4"},
         step(6, T + 10), step(8, T + 11)],
        [step(10, T + 12)], [end("finished", T + 13, 40)],
        seconds=[1, 1, 1, 30, 1])

    summary, said = follow_in_text(folder, meanwhile)

    assert said == [
        f"{at(T + 2)} run {RUN}: running on node-a · step 4/40 (10%) · epoch 1/2 · loss 0.25 · "
        "2 steps/s · ETA 18 s",
        f"{at(T + 4)} epoch 1 done: train_loss 0.9, val_loss 0.5",
        f"{at(T + 5)} run {RUN}: restarting on node-a · step 6/40 (15%) · epoch 1/2 · "
        "loss 0.1667 · RuntimeError: peer gone",
        f"{at(T + 9)} started on node-b (process 7) at step 4",
        f"{at(T + 9)} resume: resuming from step 4",
        f"{at(T + 11)} run {RUN}: running on node-b · step 8/40 (20%) · epoch 1/2 · "
        "loss 0.125 · 2 steps/s · ETA 16 s",
        f"{at(T + 12)} run {RUN}: running on node-b · step 10/40 (25%) · epoch 1/2 · "
        "loss 0.1 · 2 steps/s · ETA 15 s",  # 30 s after the last progress line
        f"{at(T + 13)} run {RUN}: finished on node-b · step 40/40 · epoch 2/2 · loss 0.1"]
    assert (summary.status, summary.host) == ("finished", "node-b")
    assert meanwhile.chunks == []
    assert meanwhile.pauses == [1.0] * 5  # a look a second


def test_looks_that_cost_more_than_a_hundredth_of_a_second_are_spaced_out(
        tmp_path: Path) -> None:
    log = log_of(tmp_path)
    append(log, start(T, "node-a", 5), step(2, T + 1))
    meanwhile = Meanwhile(log, [step(4, T + 2)], [end("finished", T + 3, 40)])
    follow_in_text(tmp_path, meanwhile, cpu_per_look=0.05)  # a record of a million steps
    assert meanwhile.pauses == pytest.approx([5.0, 5.0])  # 1% of a core


def test_the_newest_run_is_followed_unless_one_is_named(tmp_path: Path) -> None:
    append(log_of(tmp_path), start(T, "node-a", 5), end("finished", T + 1, 40))
    append(log_of(tmp_path, OTHER), start(T + 2, "node-a", 6), end("failed", T + 3, 2))
    newest, said = follow_in_text(tmp_path, Meanwhile(log_of(tmp_path)))
    assert (newest.id, newest.status) == (OTHER, "failed")
    assert said == [f"{at(T + 3)} run {OTHER}: failed on node-a · step 2/40 (5%) · epoch 1/2"]
    named, _ = follow_in_text(tmp_path, Meanwhile(log_of(tmp_path)), run=RUN)
    assert (named.id, named.status) == (RUN, "finished")


def test_a_log_its_writer_has_only_just_made_is_waited_for(tmp_path: Path) -> None:
    log = log_of(tmp_path)
    log.parent.mkdir(parents=True)
    log.touch()
    meanwhile = Meanwhile(log, lambda: None, [start(T, "node-a", 5), end("finished", T + 1, 40)])
    summary, said = follow_in_text(tmp_path, meanwhile)
    assert said == [f"waiting for the first record of run {RUN}",
                    f"{at(T + 1)} run {RUN}: finished on node-a · step 40/40 · epoch 2/2"]
    assert summary.status == "finished"


def test_an_interrupt_stops_the_following_in_one_line_and_the_run_goes_on(
        tmp_path: Path) -> None:
    log = log_of(tmp_path)
    append(log, start(T, "node-a", 5), step(2, T + 1), step(4, T + 2))
    before = log.read_bytes()

    def stop() -> None:
        raise KeyboardInterrupt

    with pytest.raises(FollowStopped) as stopped:
        follow_in_text(tmp_path, Meanwhile(log, stop))
    line = (f"stopped following run {RUN} (it goes on): running on node-a · step 4/40 (10%) · "
            "epoch 1/2 · loss 0.25 · 2 steps/s · ETA 18 s")
    assert str(stopped.value) == line
    assert isinstance(stopped.value, KeyboardInterrupt)
    assert log.read_bytes() == before  # following writes nothing in the record
    entry = records.read_index_entry(records.index_dir() / f"{RUN}.json")
    assert entry is not None and entry["log"] == str(log)


@pytest.mark.fuse
def test_a_record_that_cannot_be_read_for_a_while_is_read_again(
        tmp_path: Path, faulty_mount: FaultyMount) -> None:
    mounted = faulty_mount.path / "ck"
    log = log_of(mounted)
    append(log, start(T, "node-a", 5), step(2, T + 1), step(4, T + 2))
    meanwhile = Meanwhile(
        log, lambda: faulty_mount.fail(errno.ENOTCONN, ops="open"), lambda: None,
        lambda: (faulty_mount.heal(), append(log, step(6, T + 3), end("finished", T + 4, 40))))
    summary, said = follow_in_text(mounted, meanwhile)
    assert said[1:] == [
        f"cannot read {log} (Transport endpoint is not connected); trying again every 1 s",
        f"reading {log} again",
        f"{at(T + 4)} run {RUN}: finished on node-a · step 40/40 · epoch 2/2 · loss 0.1667"]
    assert summary.status == "finished"


@pytest.mark.fuse
def test_a_folder_that_cannot_be_read_is_said_in_one_line(
        tmp_path: Path, faulty_mount: FaultyMount) -> None:
    mounted = faulty_mount.path / "my 'ck'"
    append(log_of(mounted), start(T, "node-a", 5))
    faulty_mount.fail(errno.ENOTCONN, ops="listdir")
    with pytest.raises(OSError) as raised:
        follow_run(mounted)
    assert str(raised.value) == (f"cannot read the folder {str(mounted)!r}: "
                                 "Transport endpoint is not connected")


def test_mistakes_are_said_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "it's a \"folder\""
    with pytest.raises(FileNotFoundError) as missing:
        follow_run(folder)
    assert str(missing.value) == (f"no folder {str(folder)!r}: give a checkpoint folder "
                                  "(fit's checkpoint=)")
    folder.mkdir()
    with pytest.raises(UnknownRunError) as none:
        follow_run(folder)
    assert str(none.value) == (f"no runs in {str(folder)!r}: fit records each run there, "
                               "in .ipycloud-runs, once it starts")
    for run in (RUN, OTHER):
        append(log_of(folder, run), start(T, "node-a", 5), end("finished", T + 1, 40))
    with pytest.raises(UnknownRunError) as unknown:
        follow_run(folder, "ffffffffffff")
    assert str(unknown.value) in (  # the runs ended at the same time: in either order
        f"no run ffffffffffff in {str(folder)!r}; its runs: {first}, {second}"
        for first, second in ((RUN, OTHER), (OTHER, RUN)))
    with pytest.raises(ValueError) as not_an_id:
        follow_run(folder, "latest")
    assert str(not_an_id.value) == ("run is a run's id, 12 hex digits as ipycloud.runs lists "
                                    "them, not 'latest'")
    a_file = log_of(folder)
    with pytest.raises(NotADirectoryError, match="is not a folder: give a checkpoint folder"):
        follow_run(a_file)


def test_a_followed_run_is_in_the_index_as_this_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = records.index_dir() / f"{RUN}.json"
    index.parent.mkdir(parents=True)
    index.write_text(json.dumps({"run": RUN, "log": "/elsewhere/a.jsonl", "pid": 5,
                                 "host": "node-a", "kernel": None, "followers": [
                                     {"pid": 1, "host": "laptop", "kernel": "k0"}]}))
    append(log_of(tmp_path), start(T, "node-a", 5), end("finished", T + 1, 40))
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher", "-f", "/run/kernel-k1.json"])
    follow_in_text(tmp_path, Meanwhile(log_of(tmp_path)))
    follow_in_text(tmp_path, Meanwhile(log_of(tmp_path)))  # once only
    entry = json.loads(index.read_text())
    assert entry == {"run": RUN, "log": str(log_of(tmp_path)), "pid": 5, "host": "node-a",
                     "kernel": None, "followers": [
                         {"pid": 1, "host": "laptop", "kernel": "k0"},
                         {"pid": os.getpid(), "host": socket.gethostname(), "kernel": "k1"}]}
    assert records.entry_kernels(entry) == {"k0", "k1"}

    records.write_index_entry(RUN, {"run": RUN, "log": str(log_of(tmp_path)), "pid": 9,
                                    "host": "node-c", "kernel": None})  # a rerun here
    rewritten = json.loads(index.read_text())
    assert (rewritten["pid"], rewritten["followers"]) == (9, entry["followers"])


def test_the_cli_follows_a_run_and_says_how_it_ended_in_its_exit_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ck 'a'"
    append(log_of(folder), start(T, "node-a", 5), end("finished", T + 1, 40))
    assert main(["runs", str(folder), "--follow"]) == 0
    assert capsys.readouterr().out == (f"{at(T + 1)} run {RUN}: finished on node-a · "
                                       "step 40/40 · epoch 2/2\n")
    append(log_of(folder, OTHER), start(T, "node-a", 5), end("failed", T + 2, 2, "OOM"))
    assert main(["runs", str(folder), "--follow", "--run", OTHER]) == 1
    assert capsys.readouterr().out.endswith("failed on node-a · step 2/40 (5%) · epoch 1/2 · "
                                            "OOM\n")
    assert main(["runs", str(folder), "--follow", "--run", "ffffffffffff"]) == 1
    assert capsys.readouterr().err == (f"ipycloud runs: no run ffffffffffff in {str(folder)!r};"
                                       f" its runs: {OTHER}, {RUN}\n")


@pytest.mark.parametrize(("arguments", "said"), [
    (["--follow"], "--follow needs FOLDER, the checkpoint folder the run is recorded in"),
    (["FOLDER", "--follow", "--json"], "--follow prints lines as the run goes: leave out --json"),
    (["FOLDER", "--run", RUN], "--run ID goes with --follow"),
    (["FOLDER", "--follow", "--run", "latest"],
     "argument --run: 'latest' is no run id: 12 hex digits, as ipycloud runs FOLDER lists them"),
])
def test_the_cli_refuses_what_does_not_go_with_follow(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str],
        said: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["runs", *(str(tmp_path) if word == "FOLDER" else word for word in arguments)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"ipycloud runs: error: {said}"


def test_ctrl_c_stops_ipycloud_runs_follow_with_its_line(tmp_path: Path) -> None:
    append(log_of(tmp_path), start(T, "node-a", 5), step(2, T + 1))
    process = subprocess.Popen([sys.executable, "-m", "ipycloud", "runs", str(tmp_path),
                                "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.endswith(f"run {RUN}: running on node-a · step 2/40 (5%) · epoch 1/2 · "
                              "loss 0.5\n")
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGINT
    assert out == (f"stopped following run {RUN} (it goes on): running on node-a · step 2/40 "
                   "(5%) · epoch 1/2 · loss 0.5\n")
    assert err == ""
