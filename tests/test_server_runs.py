"""The runs a real Jupyter server with ipycloud's extension serves: those of its kernels
found through the user's index of runs (started there, or followed there with
``ipycloud.follow`` from a bucket outside its root), those whose logs lie under its root
folder (hidden and ignored folders skipped, the walk bounded), one run's records after a
time, and the mistakes a client can make."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_server.auth import Authorizer
from kernels import run
from server_fixtures import *  # noqa: F403
from server_fixtures import Api

from ipycloud.runtime.runs import records
from ipycloud.server import runs as server_runs
from ipycloud.server.handlers import AUTH_RESOURCE
from ipycloud.server.runs import FRESH_S, SCAN_FRESH_S, RunFinder, walk

pytestmark = pytest.mark.filterwarnings("error:Extension endpoints without")

T0 = 1_700_000_000.0
LIVE, DONE, HIDDEN, IGNORED, ROOT_LEVEL, ELSEWHERE = (
    "a1a1a1a1a1a1", "b2b2b2b2b2b2", "c3c3c3c3c3c3", "d4d4d4d4d4d4", "e5e5e5e5e5e5",
    "f6f6f6f6f6f6")


def write_run(log: Path, run_id: str, *, steps: int = 3, kernel: str | None = None,
              ended: bool = False, at: float = T0, pid: int | None = None) -> Path:
    """A run log as fit writes it: a start, ``steps`` step rows a second apart, an end."""
    log.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"t": at, "kind": "start", "run": run_id, "pid": pid or os.getpid(),
              "host": socket.gethostname(), "kernel": kernel, "notebook": "train.ipynb",
              "step": 0, "epoch": 0, "total_steps": 100, "epochs": 2,
              "folder": str(log.parent.parent), "device": "cpu", "model": "Net"}]
    lines += [{"t": at + step, "kind": "step", "step": step, "epoch": 0, "loss": 1.0 / step,
               "lr": 0.1} for step in range(1, steps + 1)]
    if ended:
        lines.append({"t": at + steps + 1, "kind": "end", "status": "finished", "reason": None,
                      "step": steps, "epoch": 1, "best": None})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return log


def append(log: Path, *lines: dict[str, Any]) -> None:
    with log.open("a") as file:
        file.write("".join(json.dumps(line) + "\n" for line in lines))


def index(run_id: str, log: Path, kernel: str | None) -> None:
    """The user index's entry of a run, as fit writes it."""
    folder = records.index_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{run_id}.json").write_text(json.dumps({
        "run": run_id, "log": str(log), "pid": os.getpid(), "host": socket.gethostname(),
        "kernel": kernel, "started": T0}))


def inline(work: Callable[[], None]) -> None:
    """Make a view that is due at once, not on a thread: the test sees it next."""
    work()


def in_folder(folder: Path, run_id: str) -> Path:
    return folder / records.RECORD_FOLDER / f"{run_id}{records.SUFFIX}"


@pytest.fixture
def root_runs(jp_root_dir: Path) -> Path:
    """The server's root with runs in checkpoint folders: two found, two skipped."""
    write_run(in_folder(jp_root_dir / "project with spaces" / "ck 'one'", LIVE), LIVE)
    write_run(in_folder(jp_root_dir / "old", DONE), DONE, ended=True, at=T0 - 3600)
    write_run(in_folder(jp_root_dir / ".cache" / "ck", HIDDEN), HIDDEN)
    write_run(in_folder(jp_root_dir / "web" / "node_modules" / "ck", IGNORED), IGNORED)
    return jp_root_dir


def test_runs_under_the_root_are_listed_newest_first(api: Api, root_runs: Path) -> None:
    listed = api.get("runs")["runs"]
    assert [run["id"] for run in listed] == [LIVE, DONE]
    live, done = listed
    assert live["status"] == "running"
    assert (live["step"], live["total_steps"], live["last_loss"]) == (3, 100, 1 / 3)
    assert live["log"] == str(in_folder(root_runs / "project with spaces" / "ck 'one'", LIVE))
    assert done["status"] == "finished"
    assert set(live) >= {"id", "status", "notebook", "host", "pid", "kernel", "folder", "log",
                         "started", "updated", "step", "total_steps", "epoch", "epochs",
                         "steps_per_s", "eta_s", "session_left_s", "last_loss", "best",
                         "events", "checkpoints", "device", "model"}


def test_a_run_log_at_the_roots_top_is_found(api: Api, jp_root_dir: Path) -> None:
    write_run(in_folder(jp_root_dir, ROOT_LEVEL), ROOT_LEVEL)
    assert [run["id"] for run in api.get("runs")["runs"]] == [ROOT_LEVEL]


def test_one_run_with_its_records_after_a_time(api: Api, root_runs: Path) -> None:
    whole = api.get(f"runs/{LIVE}")
    assert whole["run"]["id"] == LIVE
    assert [line["kind"] for line in whole["records"]] == ["start", "step", "step", "step"]
    log = in_folder(root_runs / "project with spaces" / "ck 'one'", LIVE)
    append(log, {"t": T0 + 4, "kind": "step", "step": 4, "epoch": 0, "loss": 0.2},
           {"t": T0 + 5, "kind": "event", "event": "pause", "message": "paused by the user"})
    # the summary is a look's, the records as read so far: they may be a look ahead of it
    later = api.wait(lambda: (found := api.get(f"runs/{LIVE}", params={"since": repr(T0 + 3)}))
                     ["run"]["events"] and found, what="the records appended, summed up")
    assert [line["t"] for line in later["records"]] == [T0 + 4, T0 + 5]
    assert (later["run"]["step"], later["run"]["events"]) == (4, 1)  # the log as it is now
    assert api.get(f"runs/{LIVE}", params={"since": repr(T0 + 5)})["records"] == []


def test_an_unknown_run_is_a_404_and_a_bad_since_a_400(api: Api, root_runs: Path) -> None:
    for run_id in (HIDDEN, IGNORED, "no-such-run", "..%2F..%2Fetc"):
        response = api.response("ipycloud", "api", "runs", run_id)
        assert response.code == 404, run_id
        assert "GET runs lists them" in json.loads(response.body)["message"]
    response = api.response("ipycloud", "api", "runs", LIVE, params={"since": "yesterday"})
    assert response.code == 400
    assert json.loads(response.body) == {
        "message": "since must be a finite number (a Unix time in seconds), not 'yesterday'"}


@pytest.mark.parametrize("route", ["runs", f"runs/{LIVE}"])
def test_the_runs_routes_refuse_a_request_without_the_token(api: Api, root_runs: Path,
                                                            route: str) -> None:
    response = api.response("ipycloud", "api", *route.split("/"),
                            headers={"Authorization": "token wrong"})
    assert response.code == 403


class DenyIpycloud(Authorizer):
    """An authorizer that refuses the ipycloud resource and allows everything else."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return not (action == "read" and resource == AUTH_RESOURCE)


@pytest.mark.parametrize("server_extra_config",
                         [{"ServerApp": {"authorizer_class": DenyIpycloud}}])
@pytest.mark.parametrize("route", ["runs", f"runs/{LIVE}"])
def test_the_runs_routes_ask_the_authorizer_to_read_ipycloud(api: Api, root_runs: Path,
                                                             route: str) -> None:
    assert api.response("ipycloud", "api", *route.split("/")).code == 403


def test_runs_of_the_servers_kernels_are_found_through_the_index(
        api: Api, tmp_path: Path) -> None:
    session = api.post("api", "sessions", body={
        "path": "train.ipynb", "type": "notebook", "name": "train.ipynb",
        "kernel": {"name": "python3"}})
    kernel_id = session["kernel"]["id"]
    elsewhere = tmp_path / "drive" / "ck"  # outside the server's root
    index(ELSEWHERE, write_run(in_folder(elsewhere, ELSEWHERE), ELSEWHERE, kernel=kernel_id),
          kernel_id)
    other = "0123456789ab"
    index(other, write_run(in_folder(elsewhere, other), other, kernel="another-servers"),
          "another-servers")
    assert [run["id"] for run in api.get("runs")["runs"]] == [ELSEWHERE]
    assert api.get(f"runs/{ELSEWHERE}")["run"]["kernel"] == kernel_id
    assert api.response("ipycloud", "api", "runs", other).code == 404
    api.wait(lambda: api.get("kernels")["kernels"], what="the kernel seen by the server")
    api.response("api", "kernels", kernel_id, method="DELETE")
    api.wait(lambda: not api.get("kernels")["kernels"], what="the kernel to end")
    # a run whose kernel ended since is still the server's
    assert [run["id"] for run in api.get("runs")["runs"]] == [ELSEWHERE]


def test_a_run_followed_in_a_kernel_is_listed_though_its_log_lies_outside_the_root(
        api: Api, jp_serverapp: Any, tmp_path: Path) -> None:
    kernel_id = api.post("api", "sessions", body={
        "path": "follow.ipynb", "type": "notebook", "name": "follow.ipynb",
        "kernel": {"name": "python3"}})["kernel"]["id"]
    bucket = tmp_path / "mnt" / "bucket 'ck'"  # a bucket mounted outside the server's root
    log = write_run(in_folder(bucket, ELSEWHERE), ELSEWHERE, ended=True, at=time.time() - 60)
    lines = log.read_text().splitlines()
    log.write_text("".join(line.replace(f'"host": "{socket.gethostname()}"', '"host": "node-b"')
                           + "\n" for line in lines))  # written on a node of a cluster
    assert api.get("runs")["runs"] == []

    client = BlockingKernelClient()
    client.load_connection_info(jp_serverapp.kernel_manager.get_kernel(kernel_id)
                                .get_connection_info())
    # The client's heartbeat counts the kernel dead after one ping unanswered for 1 s (its
    # default), which a kernel starting on a loaded machine misses: a looser one.
    client.hb_channel.time_to_dead = 10.0
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        said = run(client, f"import ipycloud\nipycloud.follow({str(bucket)!r})")
    finally:
        client.stop_channels()
    assert said == (f"<training curves>run {ELSEWHERE}: finished on node-b · step 3/100 (3%) · "
                    "epoch 2/2 · loss 0.3333")  # its curves, then the summary it returned

    [listed] = api.wait(lambda: api.get("runs")["runs"], what="the followed run listed")
    assert (listed["id"], listed["host"], listed["remote"], listed["log"]) == (
        ELSEWHERE, "node-b", True, str(log))
    assert api.get(f"runs/{ELSEWHERE}")["run"]["status"] == "finished"


def test_the_walk_is_bounded_and_follows_no_links(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path
    for level in range(server_runs.SCAN_DEPTH + 1):
        deep = deep / f"level {level}"
    write_run(in_folder(deep.parent, LIVE), LIVE)  # SCAN_DEPTH folders down: found
    write_run(in_folder(deep, DONE), DONE)  # one more: not
    (tmp_path / "loop").symlink_to(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name} outside"
    write_run(in_folder(outside, ELSEWHERE), ELSEWHERE)
    (tmp_path / "link").symlink_to(outside)
    assert [log.stem for log in walk(tmp_path)] == [LIVE]
    monkeypatch.setattr(server_runs, "SCAN_FOLDERS", 3)
    assert walk(tmp_path) == []  # three folders read, the log is deeper
    monkeypatch.undo()
    ticks = iter(range(100))
    assert walk(tmp_path, clock=lambda: next(ticks) * server_runs.SCAN_SECONDS) == []


def test_the_walks_findings_serve_a_while(tmp_path: Path) -> None:
    clock = [0.0]
    finder = RunFinder(tmp_path, clock=lambda: clock[0], background=inline)
    write_run(in_folder(tmp_path / "a", LIVE), LIVE)
    assert [run["id"] for run in finder.summaries(())] == [LIVE]
    write_run(in_folder(tmp_path / "b", DONE), DONE, at=T0 + 100)
    clock[0] = SCAN_FRESH_S - 0.1
    assert [run["id"] for run in finder.summaries(())] == [LIVE]  # the last walk's
    clock[0] = SCAN_FRESH_S + FRESH_S
    assert [run["id"] for run in finder.summaries(())] == [DONE, LIVE]


def test_a_running_run_whose_process_died_is_lost_though_its_log_is_unchanged(
        tmp_path: Path) -> None:
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    clock = [0.0]
    finder = RunFinder(tmp_path, clock=lambda: clock[0], background=inline)
    write_run(in_folder(tmp_path, LIVE), LIVE, pid=trainer.pid)
    try:
        assert [run["status"] for run in finder.summaries(())] == ["running"]
    finally:
        trainer.kill()
        trainer.wait()
    assert [run["status"] for run in finder.summaries(())] == ["running"]  # as read a while ago
    clock[0] = FRESH_S
    assert [run["status"] for run in finder.summaries(())] == ["lost"]


def test_a_view_that_is_due_is_made_in_the_background_while_the_last_one_answers(
        tmp_path: Path) -> None:
    clock = [0.0]
    due: list[Callable[[], None]] = []
    finder = RunFinder(tmp_path, clock=lambda: clock[0], background=due.append)
    assert finder.summaries(()) == []  # the first view is made at once
    write_run(in_folder(tmp_path, LIVE), LIVE)
    clock[0] = SCAN_FRESH_S
    assert finder.summaries(()) == []  # the last view answers while the next is due
    assert finder.summaries(()) == []
    assert len(due) == 1  # one making at a time
    due[0]()
    assert [run["id"] for run in finder.summaries(())] == [LIVE]
    write_run(in_folder(tmp_path / "b", DONE), DONE, kernel="k", at=T0 - 100)
    index(DONE, in_folder(tmp_path / "b", DONE), "k")
    assert [run["id"] for run in finder.summaries(("k",))] == [LIVE, DONE]  # other kernels:
    assert len(due) == 1  # made at once


def test_the_lines_appended_to_a_log_are_read_each_once_when_whole(tmp_path: Path) -> None:
    clock = [0.0]
    finder = RunFinder(tmp_path, clock=lambda: clock[0], background=inline)
    log = write_run(in_folder(tmp_path, LIVE), LIVE)

    def steps() -> list[int]:
        found = finder.run(LIVE, (), None)
        assert found is not None
        clock[0] += FRESH_S
        return [line["step"] for line in found[1] if line["kind"] == "step"]

    assert steps() == [1, 2, 3]
    with log.open("a") as file:  # a line whole, the next one half written
        file.write(json.dumps({"t": T0 + 4, "kind": "step", "step": 4}) + '\n{"t": 1700000005')
    assert steps() == [1, 2, 3, 4]
    with log.open("a") as file:
        file.write(', "kind": "step", "step": 5}\n')
    assert steps() == [1, 2, 3, 4, 5]
    write_run(log, LIVE, steps=1)  # another log in its place, shorter
    assert steps() == [1]
