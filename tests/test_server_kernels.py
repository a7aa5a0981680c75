"""Real kernels started through a real Jupyter server with ipycloud's extension: the kernels
table attributes a fake board's GPU processes to the right notebooks, and a kernel SIGKILLed
while the fake cgroup counts an OOM kill (or while RAM is at its limit) is an out-of-memory
event with the limit and the peak."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kernels import run
from server_fixtures import *  # noqa: F403
from server_fixtures import MIB, RAM_LIMIT, Api, cgroup_file

from ipycloud.server.kernels import NO_PID_PROBLEM

TIMEOUT = 45.0  # a kernel start on a busy two-core machine


def start_session(api: Api, path: str) -> str:
    """A notebook session through the sessions API; its kernel's id."""
    session = api.post("api", "sessions", body={
        "path": path, "type": "notebook", "name": Path(path).name,
        "kernel": {"name": "python3"}})
    kernel_id: str = session["kernel"]["id"]
    return kernel_id


def measured(api: Api, kernel_id: str, other_than: int | None = None) -> dict[str, Any]:
    """The kernel's entry once a reading has measured its process (another one than
    ``other_than``, for a kernel being restarted)."""
    def ready() -> dict[str, Any] | None:
        entry: dict[str, Any] = api.get(f"kernels/{kernel_id}")
        fresh = entry["pid"] is not None and entry["pid"] != other_than
        return entry if fresh and entry["rss"] is not None else None

    return api.wait(ready, timeout=TIMEOUT, what=f"kernel {kernel_id} measured")


def spawn_child(serverapp: Any, kernel_id: str) -> int:
    """Start a sleeping child process inside the kernel; its PID."""
    client = BlockingKernelClient()
    client.load_connection_info(serverapp.kernel_manager.get_kernel(kernel_id)
                                .get_connection_info())
    client.start_channels()
    try:
        client.wait_for_ready(timeout=TIMEOUT)
        return int(run(client, "import subprocess, sys\n"
                               "child = subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(120)'])\n"
                               "print(child.pid)"))
    finally:
        client.stop_channels()


@pytest.mark.parametrize("board_name", ["2xA100-MIG"])
def test_gpu_memory_is_attributed_to_the_notebook_whose_process_tree_holds_it(
        api: Api, fake_board: Any, jp_serverapp: Any) -> None:
    train = start_session(api, "work/train.ipynb")
    evaluate = start_session(api, "eval.ipynb")
    child = spawn_child(jp_serverapp, train)
    train_pid, evaluate_pid = measured(api, train)["pid"], measured(api, evaluate)["pid"]
    gpu0, gpu1 = fake_board.gpus
    fake_board.gpus[:] = [
        replace(gpu0, processes=[(train_pid, 1000)]),
        replace(gpu1, processes=[(child, 2000), (evaluate_pid, 500), (os.getpid(), 7)]),
    ]

    def attributed() -> dict[str, dict[str, Any]] | None:
        table = {entry["id"]: entry for entry in api.get("kernels")["kernels"]}
        done = table[train]["processes"] == 2 and len(table[train]["gpu_memory"]) == 2
        return table if done and table[evaluate]["gpu_memory"] else None

    table = api.wait(attributed, timeout=TIMEOUT, what="GPU memory per kernel")
    assert table[train]["gpu_memory"] == [{"gpu": 0, "used": 1000 * MIB},
                                          {"gpu": 1, "used": 2000 * MIB}]
    assert table[evaluate]["gpu_memory"] == [{"gpu": 1, "used": 500 * MIB}]
    assert {key: table[train][key] for key in ("name", "path", "type", "pid", "problem")} == {
        "name": "python3", "path": "work/train.ipynb", "type": "notebook", "pid": train_pid,
        "problem": None}
    assert table[evaluate]["path"] == "eval.ipynb"
    assert table[evaluate]["processes"] == 1
    assert table[train]["rss"] > table[evaluate]["rss"] > 0  # the child's RSS counts too
    assert table[train]["execution_state"] in ("idle", "busy")
    assert api.get("kernels")["gpu_problem"] is None


def test_a_kernel_without_a_local_process_is_an_entry_with_a_problem(
        api: Api, jp_serverapp: Any) -> None:
    kernel_id = start_session(api, "remote.ipynb")
    measured(api, kernel_id)
    provisioner = jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner
    pid, provisioner.pid = provisioner.pid, None  # as a remote provisioner has it
    try:
        entry = api.get(f"kernels/{kernel_id}")
        assert (entry["pid"], entry["problem"]) == (None, NO_PID_PROBLEM)
        assert (entry["processes"], entry["rss"], entry["gpu_memory"]) == (None, None, [])
        assert entry["path"] == "remote.ipynb"
    finally:
        provisioner.pid = pid


def test_kernel_deaths_are_events_with_their_reason(api: Api, system_root: Path) -> None:
    kernel_id = start_session(api, "train.ipynb")
    first = measured(api, kernel_id)["pid"]

    # 1. The OOM killer: the cgroup counts a kill (its peak counter alone would not tell).
    cgroup_file(system_root, "memory.peak").write_text(f"{900 * MIB}\n")
    cgroup_file(system_root, "memory.events").write_text(
        "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    os.kill(first, signal.SIGKILL)
    (oom,) = api.wait(lambda: api.get("events")["events"], timeout=TIMEOUT,
                      what="the first death's event")
    assert {key: value for key, value in oom.items() if key != "time"} == {
        "id": 1, "kind": "kernel_died", "kernel_id": kernel_id, "path": "train.ipynb",
        "reason": "out of memory", "out_of_memory": True,
        "ram_limit": RAM_LIMIT, "ram_peak": 900 * MIB,
        "message": "the kernel of train.ipynb was killed: out of memory "
                   "(limit 1024 MiB, peak 900 MiB)"}  # in one unit

    # 2. A SIGKILL while RAM is far from its limit and the counters stand still.
    second = measured(api, kernel_id, other_than=first)["pid"]
    os.kill(second, signal.SIGKILL)
    (killed,) = api.wait(lambda: api.get("events", params={"since": repr(oom["time"])})
                         ["events"], timeout=TIMEOUT, what="the second death's event")
    assert killed["id"] == 2 and killed["time"] > oom["time"]
    assert (killed["reason"], killed["out_of_memory"]) == ("killed by signal 9", False)
    assert killed["ram_peak"] == 256 * MIB  # as sampled: the peak counter did not move
    assert killed["message"] == "the kernel of train.ipynb was killed by signal 9 (SIGKILL)"

    # 3. A SIGKILL while RAM is within a few percent of its limit: the OOM killer's too.
    cgroup_file(system_root, "memory.current").write_text(f"{1020 * MIB}\n")
    third = measured(api, kernel_id, other_than=second)["pid"]
    api.wait(lambda: api.get("reading")["ram"]["used"] == 976 * MIB, what="RAM at 95%")
    os.kill(third, signal.SIGKILL)
    (at_limit,) = api.wait(lambda: api.get("events", params={"since": repr(killed["time"])})
                           ["events"], timeout=TIMEOUT, what="the third death's event")
    assert (at_limit["reason"], at_limit["out_of_memory"]) == ("out of memory", True)
    assert at_limit["ram_peak"] == 976 * MIB
    assert [event["id"] for event in api.get("events")["events"]] == [1, 2, 3]
    # Restarted once more: the server's shutdown at the end does not race the restart.
    measured(api, kernel_id, other_than=third)


@pytest.mark.parametrize("server_extra_config", [{"KernelRestarter": {"restart_limit": 0}}])
def test_a_kernel_that_is_not_restarted_is_an_event_and_leaves_the_table(api: Api) -> None:
    kernel_id = start_session(api, "once.ipynb")
    os.kill(measured(api, kernel_id)["pid"], signal.SIGKILL)
    (event,) = api.wait(lambda: api.get("events")["events"], timeout=TIMEOUT,
                        what="the death's event")
    assert (event["kernel_id"], event["path"], event["reason"]) == (
        kernel_id, "once.ipynb", "killed by signal 9")
    api.wait(lambda: api.get("kernels")["kernels"] == [], what="the kernel gone")
    assert api.response("ipycloud", "api", "kernels", kernel_id).code == 404
