"""A run written in turn by processes on several hosts, as torchrun restarts rank 0 on
another node: the newest start names the writer, whose host, steps and liveness the
summary gives. The logs are written here by hand, with a host that is not this machine
where the writer is remote, and judged at a chosen time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from ipycloud.runtime.runs import RunsTable, read_run, runs
from ipycloud.runtime.runs.records import RECORD_FOLDER
from ipycloud.runtime.runs.summary import STALE_S, RunSummary, progress_line, summarize

RUN = "a1b2c3d4e5f6"
T0 = 1_700_000_000.0
HERE = socket.gethostname()


def gone_pid() -> int:
    """The id of a process that ended."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(ended.stdout)


def start(t: float, host: str, pid: int, step: int = 0, epoch: int = 0,
          **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": "start", "run": RUN, "pid": pid, "host": host,
            "process_started": None, "notebook": "train.py", "step": step, "epoch": epoch,
            "total_steps": 40, "epochs": 2, "watch": {"metric": "val_loss", "mode": "min"},
            **fields}


def step(number: int, t: float) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": number, "epoch": number // 20, "loss": 1 / number}


def end(status: str, t: float, at: int) -> dict[str, Any]:
    return {"t": t, "kind": "end", "status": status, "reason": f"{status} at {at}", "step": at,
            "epoch": at // 20, "best": None}


def judged(tmp_path: Path, lines: list[dict[str, Any]], now: float) -> RunSummary:
    """The summary of a log of ``lines`` at the time ``now``."""
    log = tmp_path / RECORD_FOLDER / f"{RUN}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return summarize(log, read_run(log)[1], now=now)


def moved_to_node_b(first_pid: int) -> list[dict[str, Any]]:
    """A run begun here, failed at step 11, and continued on node-b from step 8."""
    return [start(T0, HERE, first_pid), *(step(number, T0 + number) for number in (2, 4, 6, 8)),
            {"t": T0 + 9, "kind": "epoch", "epoch": 0, "steps": 8, "val_loss": 0.5},
            step(10, T0 + 10), end("failed", T0 + 11, 10),
            start(T0 + 100, "node-b", 77, step=8, epoch=1),
            {"t": T0 + 100, "kind": "event", "event": "resume", "message": "resuming"},
            step(10, T0 + 101), step(12, T0 + 102), step(14, T0 + 103)]


def test_the_newest_start_names_the_writer_its_host_and_its_steps(tmp_path: Path) -> None:
    lines = moved_to_node_b(gone_pid())

    run = judged(tmp_path, lines, now=T0 + 104)
    assert (run.status, run.host, run.remote) == ("running", "node-b", True)
    assert [(row["step"], row["t"]) for row in run.steps] == [
        (2, T0 + 2), (4, T0 + 4), (6, T0 + 6), (8, T0 + 8), (10, T0 + 101), (12, T0 + 102),
        (14, T0 + 103)]  # the failed start's step 10 was redone
    assert (run.step, run.steps_per_s, run.eta_s) == (14, 2.0, (40 - 14) / 2.0)
    assert (run.reason, run.started) == (None, T0)  # the failure was the first writer's
    assert run.best == {"metric": "val_loss", "value": 0.5, "epoch": 0}
    assert {key: run.to_json()[key] for key in ("host", "remote", "pid")} == {
        "host": "node-b", "remote": True, "pid": 77}
    assert progress_line(run) == ("running on node-b · step 14/40 (35%) · epoch 2/2 · "
                                  "loss 0.07143 · 2 steps/s · ETA 13 s · "
                                  "best val_loss 0.5 (epoch 1)")

    lost = judged(tmp_path, lines, now=T0 + 103 + STALE_S + 1)
    assert (lost.status, lost.host, lost.eta_s) == ("lost", "node-b", None)


def test_a_writer_back_on_this_machine_is_judged_by_its_process(tmp_path: Path) -> None:
    here = [*moved_to_node_b(gone_pid()), end("paused", T0 + 104, 14),
            start(T0 + 200, HERE, os.getpid(), step=14, epoch=0,
                  process_started=psutil.Process().create_time()),
            step(16, T0 + 201)]
    alive = judged(tmp_path, here, now=T0 + 100 * STALE_S)  # however old its log
    assert (alive.status, alive.host, alive.remote, alive.step) == ("running", HERE, False, 16)

    here[-2] = start(T0 + 200, HERE, gone_pid(), step=14, epoch=0)
    assert judged(tmp_path, here, now=T0 + 202).status == "lost"  # however fresh


@pytest.mark.parametrize(("gap", "running_until"), [(1000.0, 3000.0), (10.0, STALE_S)],
                         ids=["a line every 1000 s", "a line every 10 s"])
def test_a_remote_run_that_writes_seldom_is_lost_only_after_three_of_its_waits(
        tmp_path: Path, gap: float, running_until: float) -> None:
    earlier = [start(T0 - 9000, "node-a", 5), step(2, T0 - 8999)]  # then a long restart
    lines = [*earlier, start(T0, "node-b", 77), step(10, T0 + gap), step(20, T0 + 2 * gap)]
    last = T0 + 2 * gap
    assert judged(tmp_path, lines, now=last + running_until - 1).status == "running"
    assert judged(tmp_path, lines, now=last + running_until + 1).status == "lost"


RESTARTS_LEFT = {"count": 1, "max": 3}


@pytest.mark.parametrize(("ending", "restarts", "soon", "later"), [
    ("failed", RESTARTS_LEFT, "restarting", "failed"),
    ("paused", RESTARTS_LEFT, "restarting", "paused"),
    ("failed", {"count": 3, "max": 3}, "failed", "failed"),
    ("failed", None, "failed", "failed"),
    ("finished", RESTARTS_LEFT, "finished", "finished"),
    ("stopped early", RESTARTS_LEFT, "stopped early", "stopped early"),
])
def test_an_end_torchrun_may_restart_after_is_restarting_for_a_while(
        tmp_path: Path, ending: str, restarts: dict[str, int] | None, soon: str,
        later: str) -> None:
    lines = [start(T0, "node-b", 77, restarts=restarts), step(10, T0 + 10),
             end(ending, T0 + 11, 10)]
    restarting = judged(tmp_path, lines, now=T0 + 11 + STALE_S - 1)
    assert (restarting.status, restarting.eta_s) == (soon, None)
    assert judged(tmp_path, lines, now=T0 + 11 + STALE_S + 1).status == later


def test_a_killed_process_torchrun_may_restart_is_restarting_then_lost(
        tmp_path: Path) -> None:
    lines = [start(T0, HERE, gone_pid(), restarts=RESTARTS_LEFT), step(10, T0 + 10)]
    assert judged(tmp_path, lines, now=T0 + 10 + STALE_S - 1).status == "restarting"
    assert judged(tmp_path, lines, now=T0 + 10 + STALE_S + 1).status == "lost"
    lines[0]["restarts"] = None  # outside torchrun: lost at once
    assert judged(tmp_path, lines, now=T0 + 11).status == "lost"


def test_runs_of_a_folder_give_each_runs_current_host(tmp_path: Path) -> None:
    judged(tmp_path, moved_to_node_b(gone_pid()), now=T0)
    [run] = runs(tmp_path)
    assert (run.host, run.status) == ("node-b", "lost")  # written in 2023: long stale

    here = replace(run, id="0123456789ab", start={**run.start, "host": HERE})
    header, remote, local = str(RunsTable([run, here], "in the bucket")).splitlines()[1:]
    assert header.split()[:5] == ["run", "status", "notebook", "host", "step"]
    assert remote.split()[:5] == [RUN, "lost", "train.py", "node-b", "14/40"]
    assert local.split()[:5] == ["0123456789ab", "lost", "train.py", HERE, "14/40"]
    assert "host" not in str(RunsTable([here], "here"))  # no column where every run is here
