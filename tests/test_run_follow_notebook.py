"""``ipycloud.follow`` in a notebook: the run's progress line over the curves ``fit``
draws, as one output redrawn in place at most once a second (the clock is the test's),
the steps a resume redid dropped from the curves; in a real kernel, a real training
process followed from its record to its end, and the Stop button that stops the following
with its one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernels import cell_messages, drawings, kernel, stream
from recent import now, recent_time  # noqa: F401 (recent_time: an autouse fixture)
from test_live_curves import Clock, Screen
from waiting import wait_for

from ipycloud.notebook.follow_in_cell import FollowedCurves
from ipycloud.runtime.runs import records
from ipycloud.runtime.runs.records import RECORD_FOLDER
from ipycloud.runtime.runs.run_watch import RunWatch

HERE = Path(__file__).parent
SVG = "{http://www.w3.org/2000/svg}"
RUN = "a1b2c3d4e5f6"
T = now()  # set again for each test (recent_time): runs elsewhere are fresh for 10 minutes


def append(log: Path, *lines: dict[str, Any]) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as file:
        file.write("".join(json.dumps(line) + "\n" for line in lines))


def start(t: float, step: int = 0) -> dict[str, Any]:
    return {"t": t, "kind": "start", "run": RUN, "pid": 5, "host": "node-a", "step": step,
            "epoch": 0, "total_steps": 100, "epochs": 1}


def step(number: int, t: float, loss: float) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": number, "epoch": 0, "loss": loss, "lr": 0.1}


def loss_points(html: str) -> list[tuple[float, float]]:
    """The points of the raw loss line, in SVG coordinates."""
    page = ElementTree.fromstring(f"<div>{html}</div>")
    series = next(page.iter(f"{SVG}svg")).find(f"{SVG}g[@class='series'][@data-label='loss']")
    assert series is not None
    points = series.find(f"{SVG}polyline")
    assert points is not None
    return [tuple(map(float, point.split(","))) for point in points.get("points", "").split()]


@pytest.fixture
def followed(tmp_path: Path) -> tuple[Path, Clock, Screen, Callable[[], None]]:
    """A log on another host, and ``look``: one look at it shown on the screen."""
    log = tmp_path / RECORD_FOLDER / f"{RUN}.jsonl"
    clock, screen = Clock(), Screen()
    view, watch = FollowedCurves(screen, clock=clock), RunWatch(log)

    def look() -> None:
        change = watch.look()
        view.show(watch.summary, change)

    return log, clock, screen, look


def test_redrawn_when_changed_at_most_once_a_second_and_always_at_the_end(
        followed: tuple[Path, Clock, Screen, Callable[[], None]]) -> None:
    log, clock, screen, look = followed
    append(log, start(T), step(10, T + 1, 0.9))
    look()  # the first look is drawn at once
    assert len(screen.shown) == 1
    assert f"run {RUN}: running on node-a · step 10/100 (10%) · epoch 1/1 · loss 0.9" \
        in screen.shown[0]
    clock.now += 0.5
    append(log, step(20, T + 2, 0.8), {"t": T + 2, "kind": "checkpoint", "name": "step-20",
                                       "step": 20, "epoch": 0, "folder": "/ck"})
    look()
    assert len(screen.shown) == 1  # half a second after the last drawing
    clock.now += 0.5
    look()  # nothing new, but the change above is due
    assert len(screen.shown) == 2
    assert "step 20/100 (20%)" in screen.shown[-1] and "checkpoint at step 20" in screen.shown[-1]
    clock.now += 5
    look()
    assert len(screen.shown) == 2  # nothing new: not drawn again
    append(log, step(30, T + 3, 0.7))
    look()
    assert len(screen.shown) == 3
    append(log, {"t": T + 4, "kind": "event", "event": "sigterm", "message": "SIGTERM at 30"},
           {"t": T + 4, "kind": "end", "status": "paused", "reason": "SIGTERM at step 30",
            "step": 30, "epoch": 0, "best": None})
    clock.now += 0.1
    look()  # the end is drawn at once
    assert len(screen.shown) == 4
    assert "paused on node-a · step 30/100 (30%) · epoch 1/1 · loss 0.7 · SIGTERM at step 30 " \
        "· checkpoint at step 20" in screen.shown[-1]
    assert "SIGTERM at 30" not in screen.shown[-1]  # the event: the end says why


def test_a_resume_drops_the_steps_it_redid_from_the_curves(
        followed: tuple[Path, Clock, Screen, Callable[[], None]]) -> None:
    log, clock, screen, look = followed
    append(log, start(T), step(10, T + 1, 0.9), step(20, T + 2, 0.8), step(30, T + 3, 0.7))
    look()
    assert len(loss_points(screen.shown[-1])) == 3
    append(log, start(T + 10, step=20), step(30, T + 11, 0.6), step(40, T + 12, 0.5))
    clock.now += 1
    look()
    assert len(loss_points(screen.shown[-1])) == 4  # 10, 20, and 30 and 40 of the restart
    append(log, step(50, T + 13, 0.4))
    clock.now += 1
    look()
    assert len(loss_points(screen.shown[-1])) == 5


# -- in a real kernel ------------------------------------------------------------------------


def stdout(received: list[dict[str, Any]]) -> str:
    return stream(received, "stdout")


@pytest.fixture
def notebook(tmp_path: Path) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    with kernel(tmp_path) as (manager, client):
        yield manager, client


def test_a_training_process_is_followed_to_its_end_in_one_output(
        tmp_path: Path, notebook: tuple[KernelManager, BlockingKernelClient]) -> None:
    _, client = notebook
    folder = tmp_path / "bucket 'ck'"
    training = subprocess.Popen([sys.executable, str(HERE / "recorded_training.py"),
                                 str(folder), "--item-delay", "0.01"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: any(records.read_records(log, torn_tail=False) for log in
                             folder.glob(f"{RECORD_FOLDER}/*.jsonl")), 120, "its first record")
        received, status = cell_messages(
            client, f"import ipycloud\nipycloud.follow({str(folder)!r})")
        assert training.wait(timeout=120) == 0
    finally:
        training.kill()
    assert status == "ok"
    found = drawings(received)
    kinds = [kind for kind, _, _ in found]
    assert kinds[0] == "display_data" and set(kinds[1:]) == {"update_display_data"}, kinds
    assert len(found) >= 2 and len({display_id for _, display_id, _ in found}) == 1
    assert "finished on " in found[-1][2] and "step 96/96 · epoch 12/12" in found[-1][2]
    assert [title for title in ("loss", "learning rate") if f"<title>{title}</title>"
            in found[-1][2]] == ["loss", "learning rate"]
    [log] = folder.glob(f"{RECORD_FOLDER}/*.jsonl")
    entry = records.read_index_entry(records.index_dir() / f"{log.stem}.json")
    assert entry is not None
    [follower] = records.followers(entry)  # the kernel's process (the server test: its id)
    assert follower["pid"] not in (os.getpid(), training.pid)


def test_the_stop_button_stops_the_following_with_its_line(
        tmp_path: Path, notebook: tuple[KernelManager, BlockingKernelClient]) -> None:
    manager, client = notebook
    append(tmp_path / RECORD_FOLDER / f"{RUN}.jsonl", start(T), step(10, T + 1, 0.9))
    cell = f"import ipycloud\nipycloud.follow({str(tmp_path)!r})"

    def stop_once_drawn(message: dict[str, Any]) -> None:
        if message["msg_type"] == "display_data":
            manager.interrupt_kernel()

    line = (f"stopped following run {RUN} (it goes on): running on node-a · step 10/100 (10%) "
            "· epoch 1/1 · loss 0.9\n")
    received, status = cell_messages(client, cell, stop_once_drawn)
    errors = [message["content"] for message in received if message["msg_type"] == "error"]
    assert status == "error" and [error["ename"] for error in errors] == ["FollowStopped"]
    assert stdout(received) == line

    cell_messages(client, "%load_ext ipycloud")
    received, status = cell_messages(client, cell, stop_once_drawn)
    assert status == "error"  # the cell stopped: Run All stops there
    assert [message for message in received if message["msg_type"] == "error"] == []
    assert stdout(received) == line
    assert len(drawings(received)) == 1  # the curves stay as they were


def test_in_another_thread_of_a_kernel_it_prints_lines(
        tmp_path: Path, notebook: tuple[KernelManager, BlockingKernelClient]) -> None:
    _, client = notebook
    append(tmp_path / RECORD_FOLDER / f"{RUN}.jsonl", start(T), step(10, T + 1, 0.9),
           {"t": T + 2, "kind": "end", "status": "finished", "reason": None, "step": 100,
            "epoch": 1, "best": None})
    received, status = cell_messages(client, (
        "import threading, ipycloud\n"
        f"worker = threading.Thread(target=ipycloud.follow, args=({str(tmp_path)!r},))\n"
        "worker.start(); worker.join()"))
    assert status == "ok" and drawings(received) == []
    assert stdout(received).endswith(f"run {RUN}: finished on node-a · step 100/100 · "
                                     "epoch 1/1 · loss 0.9\n")
