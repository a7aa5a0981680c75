"""The ``api/runs`` routes of the page a kernel serves: this process's runs of ``fit`` read
from their run records (a log of each kind of line, as the record's contract writes them),
in the shape of the Jupyter server's routes; another process's run is not one of them; the
token, an unknown id and a bad ``since`` are answered as the other routes answer them."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from test_webpage import get, get_json

from ipycloud.runtime.monitor.webpage import PageServer
from ipycloud.runtime.runs import records

SUMMARY_KEYS = {"id", "status", "notebook", "host", "remote", "pid", "kernel", "folder", "log",
                "started", "updated", "step", "total_steps", "epoch", "epochs",
                "steps_per_s", "eta_s", "session_left_s", "last_loss", "best", "reason",
                "events", "checkpoints", "device", "model"}
MINE, OTHERS = "a1b2c3d4e5f6", "0f0e0d0c0b0a"
T0 = 1_732_410_000.0


def write_run(state: Path, run: str, pid: int, total_steps: int = 100) -> list[dict[str, Any]]:
    """A running run's log and index entry as ``fit`` writes them: a start, four steps, an
    epoch with validation figures, a checkpoint and an event."""
    folder = state / "checkpoints"
    log = folder / ".ipycloud-runs" / f"{run}.jsonl"
    lines: list[dict[str, Any]] = [
        {"t": T0, "kind": "start", "run": run, "pid": pid, "host": socket.gethostname(),
         "kernel": None, "notebook": "train.ipynb", "platform": "Local machine",
         "session_left_s": None, "device": "cpu", "precision": "fp32", "model": "Net",
         "parameters": 10, "optimizer": "SGD", "batch_size": 8, "grad_accum": 1,
         "world_size": 1, "versions": {"ipycloud": "0.1.0", "torch": "2.13.0"}, "step": 0,
         "epoch": 0, "total_steps": total_steps, "epochs": 2, "max_steps": None,
         "folder": str(folder)},
        *({"t": T0 + step, "kind": "step", "step": step, "epoch": 0, "loss": 1.0 / step,
           "lr": 0.1, "steps_per_s": 1.0, "samples_per_s": 8.0} for step in range(1, 5)),
        {"t": T0 + 5, "kind": "epoch", "epoch": 0, "steps": 4, "train_loss": 0.5,
         "val_loss": 0.4, "val_accuracy": 0.9, "seconds": 5.0},
        {"t": T0 + 6, "kind": "checkpoint", "name": "step-4", "step": 4, "epoch": 1,
         "folder": str(folder)},
        {"t": T0 + 7, "kind": "event", "event": "pause", "message": "interrupted"},
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    index = state / "runs" / "index" / f"{run}.json"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(json.dumps({"run": run, "log": str(log), "pid": pid,
                                 "host": socket.gethostname(), "kernel": None, "started": T0}))
    return lines


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ipycloud's state folder, where the index of runs lies."""
    folder = tmp_path / "state with 'quotes'"
    monkeypatch.setenv("IPYCLOUD_STATE_DIR", str(folder))
    return folder


@pytest.fixture
def lines(state: Path) -> list[dict[str, Any]]:
    """This process's run, and a run of another (the parent, a live process)."""
    write_run(state, OTHERS, os.getppid())
    return write_run(state, MINE, os.getpid())


def test_runs_lists_this_processs_runs_only(page_server: PageServer,
                                           lines: list[dict[str, Any]]) -> None:
    (run,) = get_json(page_server, "runs")["runs"]
    assert set(run) == SUMMARY_KEYS
    assert (run["id"], run["status"], run["pid"]) == (MINE, "running", os.getpid())
    assert (run["step"], run["total_steps"], run["epoch"], run["epochs"]) == (4, 100, 1, 2)
    assert run["last_loss"] == 0.25
    assert (run["events"], run["checkpoints"]) == (1, 1)
    assert run["model"] == "Net" and run["notebook"] == "train.ipynb"


def test_a_run_this_process_follows_is_listed_too(page_server: PageServer,
                                                  lines: list[dict[str, Any]],
                                                  state: Path) -> None:
    log = state / "checkpoints" / ".ipycloud-runs" / f"{OTHERS}.jsonl"
    records.add_follower(OTHERS, log, {"pid": os.getpid(), "host": socket.gethostname(),
                                       "kernel": None})  # as ipycloud.follow does
    assert {run["id"] for run in get_json(page_server, "runs")["runs"]} == {MINE, OTHERS}


def test_a_run_gives_its_records_after_since(page_server: PageServer,
                                             lines: list[dict[str, Any]]) -> None:
    everything = get_json(page_server, f"runs/{MINE}")
    assert everything["run"]["id"] == MINE
    assert everything["records"] == lines
    later = get_json(page_server, f"runs/{MINE}", since=T0 + 3.5)
    assert [record["kind"] for record in later["records"]] == [
        "step", "epoch", "checkpoint", "event"]
    assert later["records"][0]["step"] == 4
    assert get_json(page_server, f"runs/{MINE}", since=T0 + 7)["records"] == []


def test_no_runs_before_the_first(page_server: PageServer) -> None:
    assert get_json(page_server, "runs") == {"runs": []}


@pytest.mark.parametrize(("path", "status", "message"), [
    (f"/api/runs/{OTHERS}", 404, f"no run '{OTHERS}' in this kernel: api/runs lists its runs"),
    ("/api/runs/ffffffffffff", 404,
     "no run 'ffffffffffff' in this kernel: api/runs lists its runs"),
    ("/api/runs/", 404, "no run '' in this kernel: api/runs lists its runs"),
    (f"/api/runs/{MINE}?since=soon", 400, None),
    ("/api/runsx", 404, "no route '/api/runsx'"),
])
def test_mistakes_are_answered_with_one_line(page_server: PageServer,
                                            lines: list[dict[str, Any]], path: str,
                                            status: int, message: str | None) -> None:
    separator = "&" if "?" in path else "?"
    code, content_type, body = get(page_server, f"{path}{separator}token={page_server.token}")
    assert (code, content_type) == (status, "application/json")
    answer = json.loads(body)
    assert set(answer) == {"message"}
    if message is not None:
        assert answer["message"] == message


@pytest.mark.parametrize("path", ["/api/runs", f"/api/runs/{MINE}"])
def test_the_runs_need_the_token(page_server: PageServer, lines: list[dict[str, Any]],
                                 path: str) -> None:
    assert get(page_server, path)[0] == 403
    assert get(page_server, f"{path}?token=not-it")[0] == 403
    code, _, body = get(page_server, path, {"Authorization": f"token {page_server.token}"})
    assert code == 200 and MINE in body.decode()


def test_the_routes_follow_a_growing_log_and_a_run_resumed_here(
        page_server: PageServer, state: Path, lines: list[dict[str, Any]]) -> None:
    assert get_json(page_server, f"runs/{MINE}", since=T0 + 7)["records"] == []
    log = Path(lines[0]["folder"]) / ".ipycloud-runs" / f"{MINE}.jsonl"
    step = {"t": T0 + 8, "kind": "step", "step": 5, "epoch": 1, "loss": 0.2, "lr": 0.1,
            "steps_per_s": 1.0, "samples_per_s": 8.0}
    with log.open("a") as file:
        file.write(json.dumps(step) + "\n" + '{"t": 1732410009.0, "kind": "st')  # being written
    assert get_json(page_server, f"runs/{MINE}", since=T0 + 7)["records"] == [step]
    (run,) = get_json(page_server, "runs")["runs"]
    assert (run["step"], run["last_loss"]) == (5, 0.2)

    # The other process's run, resumed by this one: its index entry now names this process.
    assert [run["id"] for run in get_json(page_server, "runs")["runs"]] == [MINE]
    entry = state / "runs" / "index" / f"{OTHERS}.json"
    resumed = write_run(state, OTHERS, os.getpid())
    os.utime(entry, ns=(1, 1))  # a change of the entry's time is what is looked at
    assert get_json(page_server, f"runs/{OTHERS}")["records"] == resumed
    assert {run["id"] for run in get_json(page_server, "runs")["runs"]} == {MINE, OTHERS}


@pytest.mark.filterwarnings("ignore::ipycloud.runtime.runs.records.RunRecordWarning")
def test_damaged_and_non_finite_lines_and_a_fifo_in_the_index_leave_strict_answers(
        page_server: PageServer, state: Path, lines: list[dict[str, Any]]) -> None:
    log = Path(lines[0]["folder"]) / ".ipycloud-runs" / f"{MINE}.jsonl"
    with log.open("a") as file:
        file.write("[" * 100_000 + "]" * 100_000 + "\n"
                   + '{"t": ' + "9" * 400 + ', "kind": "step", "step": 6}\n'
                   + '{"t": 1732410008.0, "kind": "step", "step": 5, "epoch": 1, "loss": NaN}\n')
    os.mkfifo(state / "runs" / "index" / f"{'9' * 12}.json")
    code, _, body = get(page_server, "/api/runs", {"Authorization": f"token {page_server.token}"})
    assert code == 200

    def refuse(constant: str) -> None:
        raise AssertionError(f"the answer holds {constant}")
    (run,) = json.loads(body, parse_constant=refuse)["runs"]
    assert (run["id"], run["step"], run["last_loss"]) == (MINE, 5, None)
    code, _, body = get(page_server, f"/api/runs/{MINE}",
                        {"Authorization": f"token {page_server.token}"})
    assert code == 200
    assert json.loads(body, parse_constant=refuse)["records"][-1]["loss"] is None
