"""The machine's history the server keeps for a day: thinned with age, older than the
history's length dropped, read back after a restart of a real server, a bad line skipped,
one writer per file; and the network and disk I/O figures the readings carry."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from jupyter_process import JupyterProcess
from waiting import wait_for

from ipycloud.runtime.monitor.network import NetworkMeter
from ipycloud.server.history import COMPACT_EVERY_S, KeptHistory
from ipycloud.server.settings import IpycloudServer

DAY = 86400.0
NOW = 1_800_000_000.0  # the fake clock's time


def line(stamp: float, **more: object) -> str:
    return json.dumps({"time": stamp, **more})


def times(history: KeptHistory, since: float | None = None) -> list[float]:
    return [json.loads(kept)["time"] for kept in history.since(since)]


def file_times(path: Path) -> list[float]:
    return [json.loads(text)["time"] for text in path.read_text().splitlines()]


def write_lines(path: Path, stamps: list[float], *bad: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line(stamp)}\n" for stamp in stamps) + "".join(bad))


def test_a_day_read_back_is_thinned_by_age_and_older_readings_dropped(tmp_path: Path) -> None:
    path = tmp_path / "state dir" / "server-history.jsonl"
    too_old = [NOW - DAY - 60, NOW - DAY - 1]
    hours_ago = [NOW - 3 * 3600 + second for second in range(300)]  # 5 min at 1 s
    last_hour = [NOW - 600 + second * 0.25 for second in range(40)]  # 10 s at 0.25 s
    write_lines(path, too_old + hours_ago + last_hour)
    history = KeptHistory(path, DAY, clock=lambda: NOW)
    history.open()
    kept = times(history)
    assert kept == [*hours_ago[::60], *last_hour[::4]]  # one a minute; one a second
    assert file_times(path) == kept  # the file rewritten as kept
    history.close()


def test_readings_after_a_restart_follow_those_of_the_earlier_server(tmp_path: Path) -> None:
    path = tmp_path / "server-history.jsonl"
    clock = [NOW]
    first = KeptHistory(path, DAY, clock=lambda: clock[0])
    first.open()
    for tick in range(5):
        first.add(NOW + tick, line(NOW + tick))
    first.close()
    clock[0] = NOW + 60
    second = KeptHistory(path, DAY, clock=lambda: clock[0])
    second.open()
    second.add(NOW + 60, line(NOW + 60, server="second"))
    assert times(second) == [NOW + tick for tick in range(5)] + [NOW + 60]
    assert times(second, since=NOW + 3) == [NOW + 4, NOW + 60]
    assert json.loads(second.since(NOW + 4)[0]) == {"time": NOW + 60, "server": "second"}
    assert file_times(path) == times(second)


def test_unreadable_lines_are_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "server-history.jsonl"
    write_lines(path, [NOW - 2], '{"time": NaN}\n', "not json\n", '{"no": "time"}\n',
                '["a list"]\n', '{"time": "noon"}\n', "\xff\xfe garbage\n",
                f'{line(NOW - 1)}\n', '{"time": 17999')  # the last one cut short by a kill
    history = KeptHistory(path, DAY, clock=lambda: NOW)
    history.open()
    assert times(history) == [NOW - 2, NOW - 1]


def test_readings_are_thinned_every_compaction_period(tmp_path: Path) -> None:
    path = tmp_path / "server-history.jsonl"
    clock = [NOW]
    history = KeptHistory(path, DAY, clock=lambda: clock[0])
    history.open()
    stamps = [NOW + tick * 0.5 for tick in range(int(COMPACT_EVERY_S * 2))]  # 0.5 s apart
    for stamp in stamps:
        clock[0] = stamp
        history.add(stamp, line(stamp))
    assert len(file_times(path)) == len(stamps)  # as sampled until the period is over
    clock[0] = NOW + 3 * 3600.0
    history.add(clock[0], line(clock[0]))
    assert times(history) == [*stamps[::120], clock[0]]  # an hour on: one a minute
    assert file_times(path) == times(history)


def test_a_second_server_on_the_same_file_keeps_its_readings_in_memory(
        tmp_path: Path) -> None:
    path = tmp_path / "server-history.jsonl"
    first = KeptHistory(path, DAY, clock=lambda: NOW)
    first.open()
    first.add(NOW, line(NOW))
    other = KeptHistory(path, DAY, clock=lambda: NOW)
    other.open()
    other.add(NOW + 1, line(NOW + 1))
    first.add(NOW + 2, line(NOW + 2))
    assert file_times(path) == [NOW, NOW + 2]  # only the first writes the file
    assert times(other) == [NOW, NOW + 1]  # read back what the first had kept, then its own
    first.close()
    other.close()


def test_a_history_file_that_cannot_be_written_keeps_readings_in_memory(
        tmp_path: Path) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    history = KeptHistory(blocker / "server-history.jsonl", DAY, clock=lambda: NOW)
    history.open()  # its folder cannot be made: a warning, no exception
    history.add(NOW, line(NOW))
    assert times(history) == [NOW]


def test_network_rates_are_bytes_per_second_between_readings() -> None:
    counters = {"eth0": (1000, 500), "lo": (0, 0)}
    clock = [10.0]
    meter = NetworkMeter(lambda: dict(counters), lambda: clock[0])
    assert meter.read() == (None, None)  # no baseline yet
    counters["eth0"] = (5000, 1500)
    clock[0] = 12.0
    assert meter.read() == (2000.0, 500.0)
    counters["eth0"] = (10, 10)  # the interface came back with fresh counters
    clock[0] = 13.0
    assert meter.read() == (None, None)
    counters["eth1"] = (0, 0)  # a new interface: no rate across it
    clock[0] = 14.0
    assert meter.read() == (None, None)
    counters["eth1"] = (100, 0)
    clock[0] = 15.0
    assert meter.read() == (100.0, 0.0)


@pytest.mark.timeout(180)
def test_a_restarted_server_serves_the_history_of_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "state 'dir'" / "server-history.jsonl"
    arguments = [f"--IpycloudServer.history_file={path}", "--IpycloudServer.interval=0.2"]

    def served(server: JupyterProcess) -> list[dict[str, object]]:
        samples: list[dict[str, object]] = server.api("ipycloud/api/history")["samples"]
        return samples

    home = tmp_path / "home"
    home.mkdir()
    first = JupyterProcess(home, tmp_path, arguments=arguments)
    try:
        first.wait_ready()
        before = wait_for(lambda: len(found := served(first)) >= 10 and found, 30,
                          "ten readings of the first server")
    finally:
        first.close()
    assert set(before[0]) >= {"time", "cpu", "ram", "network", "disk_io"}
    minute = time.time() // 60 * 60
    old = {**before[0], "time": minute - DAY - 5}
    hours_ago = [{**before[0], "time": minute - 3 * 3600 + tick} for tick in range(180)]
    with path.open("a") as file:
        file.write("".join(f"{json.dumps(reading)}\n" for reading in [old, *hours_ago])
                   + "{cut short\n")
    second = JupyterProcess(home, tmp_path, arguments=arguments)
    try:
        second.wait_ready()
        later = wait_for(lambda: len(found := served(second)) > 6 and found, 30,
                         "the readings of both servers")
    finally:
        second.close()
    assert all("disk_io" in reading for reading in later)  # read back with the new figure
    stamps = [reading["time"] for reading in later]
    assert isinstance(stamps[0], float)
    assert stamps[:3] == [reading["time"] for reading in hours_ago[::60]]
    first_times = {reading["time"] for reading in before}
    read_back = [stamp for stamp in stamps[3:] if stamp in first_times]
    assert len(read_back) >= 2  # the first server's, thinned to one a second
    assert len({int(stamp) for stamp in read_back}) == len(read_back)
    assert stamps[-1] > max(first_times)  # and the second's own


def test_a_day_is_kept_by_default_in_ipyclouds_state_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPYCLOUD_STATE_DIR", str(tmp_path / "my state"))
    settings = IpycloudServer()
    assert settings.history == DAY
    assert settings.history_file == str(tmp_path / "my state" / "server-history.jsonl")
    assert settings.capacity == 600  # the objects kept for explaining deaths: ten minutes
