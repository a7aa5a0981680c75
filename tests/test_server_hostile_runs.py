"""The server's runs routes beside hostile files under its root and in the user's index:
damaged and non-finite record lines, a FIFO in place of a log or an index entry, a log
truncated and regrown, a link out of the root, a long log. The server answers strict JSON
at once, and its other routes go on answering."""

from __future__ import annotations

import contextlib
import json
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_schema import check_route
from server_fixtures import *  # noqa: F403
from server_fixtures import Api
from strict_json import HOSTILE_RECORD_LINES, loads
from test_server_runs import DONE, LIVE, T0, append, in_folder, index, inline, write_run

from ipycloud.runtime.runs import polled_logs, records
from ipycloud.server.runs import FRESH_S, SCAN_FRESH_S, RunFinder

pytestmark = [pytest.mark.filterwarnings("error:Extension endpoints without"),
              pytest.mark.filterwarnings("ignore::ipycloud.runtime.runs.records.RunRecordWarning")]

REQUEST_TIMEOUT_S = 30.0  # a request the server does not answer in this long hangs




def get(api: Api, route: str, **params: str) -> Any:
    """GET an ipycloud route that must answer 200 with strict JSON, within the timeout."""
    response = api.response("ipycloud", "api", *route.split("/"), params=params or None,
                            request_timeout=REQUEST_TIMEOUT_S)
    assert response.code == 200, (route, response.code, response.body[:200])
    return check_route(route, loads(response.body))


def listed(api: Api) -> list[str]:
    return [run["id"] for run in get(api, "runs")["runs"]]


@contextlib.contextmanager
def fifo_at(path: Path) -> Iterator[Path]:
    """A FIFO put in place of ``path`` (atomically, as a rename would); any reader a server
    left blocked in it is let go at the end."""
    spare = path.with_name(path.name + ".fifo")
    os.mkfifo(spare)
    os.replace(spare, path)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):  # ENXIO: no reader is blocked in it
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_bad_record_lines_leave_the_runs_listed_in_strict_json(api: Api,
                                                               jp_root_dir: Path) -> None:
    """A server that starts with damaged lines in a log (as after a restart) lists every
    run; the damaged log's good lines are its run."""
    good = write_run(in_folder(jp_root_dir / "good", LIVE), LIVE)
    damaged = write_run(in_folder(jp_root_dir / "damaged", DONE), DONE, at=T0 - 100)
    with damaged.open("a") as file:
        file.write("".join(line + "\n" for line in HOSTILE_RECORD_LINES))
    assert listed(api) == [LIVE, DONE]
    run = get(api, f"runs/{DONE}")
    assert [line["kind"] for line in run["records"]] == ["start", "step", "step", "step"]
    assert run["run"]["step"] == 3
    append(good, {"t": T0 + 4, "kind": "step", "step": 4, "epoch": 0, "loss": 0.25})
    api.wait(lambda: get(api, "runs")["runs"][0]["step"] == 4, what="the good run to move")


def test_a_nan_loss_and_an_infinite_metric_are_null_in_the_runs_routes(
        api: Api, jp_root_dir: Path) -> None:
    log = write_run(in_folder(jp_root_dir, LIVE), LIVE)
    with log.open("a") as file:  # written by a program other than fit: JSON's extensions
        file.write('{"t": 1700000004.0, "kind": "step", "step": 4, "epoch": 0, "loss": NaN}\n'
                   '{"t": 1700000005.0, "kind": "epoch", "epoch": 0, "val_loss": Infinity}\n')
    [run] = get(api, "runs")["runs"]
    assert (run["step"], run["last_loss"]) == (4, None)
    *_, step, epoch = get(api, f"runs/{LIVE}")["records"]
    assert (step["loss"], epoch["val_loss"]) == (None, None)


def test_a_fifo_in_the_index_is_never_opened(api: Api, jp_root_dir: Path) -> None:
    write_run(in_folder(jp_root_dir, LIVE), LIVE)
    records.index_dir().mkdir(parents=True, exist_ok=True)
    with fifo_at(records.index_dir() / f"{DONE}.json"):
        assert listed(api) == [LIVE]
        for _ in range(10):  # more than the default executor's threads
            assert listed(api) == [LIVE]
            assert get(api, "history", since="0")["samples"] is not None


def test_a_fifo_swapped_in_for_a_known_log_leaves_the_view_moving(
        api: Api, jp_root_dir: Path) -> None:
    swapped = write_run(in_folder(jp_root_dir / "a", DONE), DONE, at=T0 - 100)
    moving = write_run(in_folder(jp_root_dir / "b", LIVE), LIVE)
    assert listed(api) == [LIVE, DONE]
    with fifo_at(swapped):
        for step in range(4, 8):  # the view is made again several times
            append(moving, {"t": T0 + step, "kind": "step", "step": step, "epoch": 0})
            api.wait(lambda step=step: get(api, "runs")["runs"][0]["step"] == step,  # type: ignore[misc]
                     what=f"step {step} listed")
            assert get(api, "history", since="0")["samples"] is not None
        assert listed(api) == [LIVE]  # a FIFO is no log
        response = api.response("ipycloud", "api", "runs", DONE,
                                request_timeout=REQUEST_TIMEOUT_S)
        assert response.code == 404


def test_a_log_linked_from_outside_the_root_is_not_served(api: Api, jp_root_dir: Path,
                                                          tmp_path: Path) -> None:
    outside = write_run(in_folder(tmp_path / "secret", DONE), DONE)
    inside = in_folder(jp_root_dir / "ck", DONE)
    inside.parent.mkdir(parents=True)
    inside.symlink_to(outside)
    index(DONE, inside, "another-servers")  # named in the index by its path under the root
    write_run(in_folder(jp_root_dir / "own", LIVE), LIVE)
    assert listed(api) == [LIVE]
    response = api.response("ipycloud", "api", "runs", DONE, request_timeout=REQUEST_TIMEOUT_S)
    assert response.code == 404


def test_a_log_truncated_and_regrown_in_place_is_read_afresh(tmp_path: Path) -> None:
    clock = [0.0]
    finder = RunFinder(tmp_path, clock=lambda: clock[0], background=inline)
    log = write_run(in_folder(tmp_path, LIVE), LIVE, steps=2)
    assert [run["step"] for run in finder.summaries(())] == [2]
    inode = log.stat().st_ino
    with log.open("r+") as file:  # the same file, cut and written again, longer
        file.truncate(0)
    write_run(log, LIVE, steps=5, at=T0 + 1000)
    assert log.stat().st_ino == inode
    clock[0] += SCAN_FRESH_S
    found = finder.run(LIVE, (), None)
    assert found is not None
    assert [line["t"] for line in found[1]] == [T0 + 1000 + step for step in range(6)]
    assert found[0]["step"] == 5


def test_the_view_holds_a_bounded_part_of_a_long_log(tmp_path: Path) -> None:
    """A log of 100,000 steps (11 MB): what the view keeps of it, once it has read it all
    (over several looks), is a small part."""
    log = write_run(in_folder(tmp_path, LIVE), LIVE, steps=100_000)
    size = log.stat().st_size
    clock = [0.0]
    finder = RunFinder(tmp_path, clock=lambda: clock[0], background=inline)
    tracemalloc.start()
    try:
        [run] = finder.summaries(())
        for _ in range(size // polled_logs.LOOK_BYTES + 1):
            clock[0] += FRESH_S
            [run] = finder.summaries(())
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (run["step"], run["last_loss"]) == (100_000, 1 / 100_000)
    assert kept < size / 2, f"{kept} bytes kept for a log of {size}"
    clock_view = finder.run(LIVE, (), T0 + 99_998)
    assert clock_view is not None
    assert [line["step"] for line in clock_view[1]] == [99_999, 100_000]


def test_a_live_log_is_read_from_where_the_last_look_ended(tmp_path: Path) -> None:
    """Bytes before the last look's end are not read again: a line changed in place in the
    middle of the log (past its first 4 KiB, before its last 256 bytes: those are compared
    to tell a log written again) is not seen, the appended one is."""
    clock = [0.0]
    finder = RunFinder(tmp_path, clock=lambda: clock[0], background=inline)
    log = write_run(in_folder(tmp_path, LIVE), LIVE, steps=200)
    assert finder.summaries(())[0]["step"] == 200
    text = log.read_bytes()
    middle = text.index(b'"step": 100,')
    assert 4096 < middle < len(text) - 256
    with log.open("r+b") as file:  # the same length: a reader that reads it all sees it
        file.seek(middle)
        file.write(b'"step": 999,')
        file.seek(0, os.SEEK_END)
        file.write(json.dumps({"t": T0 + 201, "kind": "step", "step": 201}).encode() + b"\n")
    clock[0] += FRESH_S
    found = finder.run(LIVE, (), None)
    assert found is not None
    assert [line["step"] for line in found[1] if line["kind"] == "step"] == list(range(1, 202))


def test_a_long_log_is_paged_through_with_since_each_record_once(tmp_path: Path) -> None:
    """A client that passes the time of the last record it got gets a 25,001-record log
    in pages of at most 10,000, every record once, in order."""
    write_run(in_folder(tmp_path, LIVE), LIVE, steps=25_000)
    finder = RunFinder(tmp_path, background=inline)
    got: list[float] = []
    pages = 0
    while True:
        found = finder.run(LIVE, (), got[-1] if got else None)
        assert found is not None
        if not found[1]:
            break
        assert len(found[1]) <= 10_000
        got += [line["t"] for line in found[1]]
        pages += 1
    assert got == [T0 + step for step in range(25_001)]
    assert pages == 3


def test_a_huge_log_fills_the_view_over_several_looks_of_bounded_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first view reads at most LOOK_BYTES of a log, and each view made after it the
    next LOOK_BYTES, until the run is whole: no request waits on the reading of a whole
    log."""
    monkeypatch.setattr(polled_logs, "LOOK_BYTES", 64 * 1024)
    log = write_run(in_folder(tmp_path, LIVE), LIVE, steps=5000, ended=True)
    size = log.stat().st_size
    assert size > 5 * 64 * 1024
    clock = [0.0]
    finder = RunFinder(tmp_path, clock=lambda: clock[0], background=inline)
    views = [finder.summaries(())[0]]
    while views[-1]["status"] != "finished" and len(views) < 100:
        clock[0] += FRESH_S
        views.append(finder.summaries(())[0])
    steps_seen = [view["step"] for view in views]
    assert steps_seen[0] < 1000  # 64 KiB hold about 800 of its lines
    assert steps_seen == sorted(steps_seen) and steps_seen[-1] == 5000
    assert len(views) >= size // (64 * 1024)
    found = finder.run(LIVE, (), None)
    assert found is not None
    steps = [line["step"] for line in found[1] if line["kind"] == "step"]
    assert steps == list(range(1, 5001))
