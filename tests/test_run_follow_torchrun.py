"""A real run of ``fit`` under torchrun (two ranks, gloo, on the CPU), restarted once by
torchrun after a rank is killed, followed live by ``ipycloud runs FOLDER --follow`` in
another process; then its record, as written, read back, and with the restarted writer
moved to another host (the one change made by hand: this machine has one host)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

from ipycloud.runtime.runs import read_run, runs
from ipycloud.runtime.runs.records import RECORD_FOLDER, read_records
from ipycloud.runtime.runs.summary import STALE_S, summarize

HERE = Path(__file__).parent
TIMEOUT_S = 180
HOST = socket.gethostname()


@dataclass
class Followed:
    folder: Path
    said: list[str]  # by the follower, line by line
    follower_status: int
    torchrun_status: int

    def log(self) -> Path:
        [log] = (self.folder / RECORD_FOLDER).glob("*.jsonl")
        return log


def read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"the follower ended: {process.communicate(timeout=TIMEOUT_S)}"
    return line.rstrip("\n")


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Followed]:
    """The run, followed from its first step to its end."""
    base = tmp_path_factory.mktemp("torchrun")
    folder, signals = base / "bucket ck", base / "signals"
    signals.mkdir()
    environment = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=2", str(HERE / "restarted_training.py"), str(folder), str(signals)],
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    follower: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: any(read_records(log, torn_tail=False)
                             for log in folder.glob(f"{RECORD_FOLDER}/*.jsonl")),
                 TIMEOUT_S, "the run's first record")
        follower = subprocess.Popen([sys.executable, "-m", "ipycloud", "runs", str(folder),
                                     "--follow"], stdout=subprocess.PIPE, text=True)
        said = [read_line(follower)]
        (signals / "kill").touch()
        while "restarting" not in said[-1]:
            said.append(read_line(follower))
        (signals / "resume").touch()
        rest, _ = follower.communicate(timeout=TIMEOUT_S)
        _, errors = torchrun.communicate(timeout=TIMEOUT_S)
        assert torchrun.returncode == 0, errors
        yield Followed(folder, said + rest.splitlines(), follower.returncode,
                       torchrun.returncode)
    finally:
        if follower is not None:
            follower.kill()
        with contextlib.suppress(ProcessLookupError):  # its processes ended
            os.killpg(torchrun.pid, signal.SIGKILL)
        torchrun.wait()


def test_a_torchrun_restart_is_followed_through_to_the_end(followed: Followed) -> None:
    said = [line.split(" ", 1)[1] for line in followed.said]  # without the time
    run = followed.log().stem
    assert said[0].startswith(f"run {run}: running on {HOST} · step ")
    restarting = next(line for line in said if " restarting " in line)
    assert restarting.startswith(f"run {run}: restarting on {HOST} · step 2")
    after = said[said.index(restarting) + 1:]
    assert any(line.startswith(f"started on {HOST} (process ") and line.endswith(
        " at step 20") for line in after), after
    assert "resume: resuming from step-000000020 (step 20, epoch 1)" in after
    assert after[-1].startswith(f"run {run}: finished on {HOST} · step 48/48 · epoch 3/3 · ")
    assert followed.follower_status == 0


def test_the_record_of_a_restarted_run_reads_as_one_run(followed: Followed) -> None:
    lines = read_run(followed.log())[1]
    starts = [line for line in lines if line["kind"] == "start"]
    assert [start["restarts"] for start in starts] == [{"count": 0, "max": 2},
                                                       {"count": 1, "max": 2}]
    assert len({start["pid"] for start in starts}) == 2
    assert [start["step"] for start in starts] == [0, 20]
    [run] = runs(followed.folder)
    assert (run.status, run.host, run.remote, run.step, run.epoch) == (
        "finished", HOST, False, 48, 3)
    steps = [row["step"] for row in run.steps]
    assert steps == sorted(set(steps)) and steps[-1] == 48  # each step once, redone ones
    assert first_try_ends(lines) in ([], ["failed"], ["paused"])


def first_try_ends(lines: list[dict[str, Any]]) -> list[str]:
    """How the first try ended: failed (its peer gone), paused (torchrun's SIGTERM), or
    without an end (torchrun's SIGKILL came first)."""
    restart = [index for index, line in enumerate(lines) if line["kind"] == "start"][1]
    return [line["status"] for line in lines[:restart] if line["kind"] == "end"]


def rehosted(lines: list[dict[str, Any]], host: str) -> list[dict[str, Any]]:
    """``lines`` with the host of the last start changed to ``host``."""
    last = max(index for index, line in enumerate(lines) if line["kind"] == "start")
    return [{**line, "host": host} if index == last else line
            for index, line in enumerate(lines)]


def test_the_restarted_record_as_another_host_wrote_it(followed: Followed,
                                                       tmp_path: Path) -> None:
    lines = read_run(followed.log())[1]
    restart = [index for index, line in enumerate(lines) if line["kind"] == "start"][1]
    ended = lines[:restart]  # up to the first try's end: torchrun may start it again
    log = tmp_path / f"{followed.log().stem}.jsonl"
    assert summarize(log, ended, now=ended[-1]["t"] + 1).status == "restarting"
    later = summarize(log, ended, now=ended[-1]["t"] + STALE_S + 1)
    assert [later.status] == (first_try_ends(lines) or ["lost"])

    resumed_rows = [index for index, line in enumerate(lines)
                    if index > restart and line["kind"] == "step"]
    going = rehosted(lines[:resumed_rows[2] + 1], "node-b")  # three rows into the restart
    run = summarize(log, going, now=going[-1]["t"] + 1)
    assert (run.status, run.host, run.remote) == ("running", "node-b", True)
    assert run.step == going[-1]["step"] and run.eta_s is not None
    steps = [row["step"] for row in run.steps]
    assert steps == sorted(set(steps))
    assert summarize(log, going, now=going[-1]["t"] + STALE_S + 1).status == "lost"
    assert json.dumps(run.to_json())  # as the server and ipycloud runs --json give it
