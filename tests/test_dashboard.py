"""The live dashboard: real sampler threads, real widgets, a real IPython shell and kernel."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import nbformat
import pytest
import traitlets
from fake_nvml import BOARDS, FakeBoard
from IPython.core.error import UsageError
from kernels import execute, outputs
from terminal import terminal_ipython
from waiting import wait_for

from ipycloud.runtime.monitor.readings import DANGER_AT, WARNING_AT, level, readings
from ipycloud.runtime.monitor.sampler import DEFAULT_INTERVAL_S, Sampler, shared_sampler
from ipycloud.runtime.monitor.samples import DiskSample, GpuSample, Sample
from ipycloud.runtime.monitor.textview import text_view
from ipycloud.runtime.monitor.usage import shared_tracker, usage_report
from ipycloud.runtime.monitor.usage_report import UsageReport
from ipycloud.widgets.dashboard import Dashboard
from ipycloud.widgets.rows import TEXT_WIDTH
from ipycloud.widgets.sparkline import HEIGHT, WIDTH, Trace, sparkline_svg

GIB = 2**30
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class ScriptedProbe:
    """A probe whose figures the test sets (CPU cycles through ``cpu``); counts readings."""

    def __init__(self, cpu: tuple[float, ...] = (0.0,), ram_used: int = 4 * GIB,
                 disk_used: int = 10 * GIB, gpus: tuple[GpuSample, ...] = (),
                 wobble: int = 0) -> None:
        self.cpu, self.ram_used, self.disk_used, self.gpus = cpu, ram_used, disk_used, gpus
        self.wobble = wobble  # bytes by which RAM and RSS move from one reading to the next
        self.readings = 0
        self._lock = threading.Lock()

    def __call__(self) -> Sample:
        with self._lock:
            cpu = self.cpu[self.readings % len(self.cpu)]
            wobble = self.wobble * (self.readings % 3)
            self.readings += 1
            return Sample(time=time.time(), cpu_percent=cpu, ram_used=self.ram_used + wobble,
                          ram_limit=16 * GIB, ram_available=16 * GIB - self.ram_used,
                          swap_used=0, swap_total=2 * GIB, process_rss=GIB + wobble,
                          disks=(DiskSample(("working",), ("/work",), 100 * GIB,
                                            self.disk_used, 100 * GIB - self.disk_used),),
                          gpus=self.gpus)

    def wait_for_readings(self, count: int) -> None:
        target = self.readings + count
        wait_for(lambda: self.readings >= target)


@pytest.fixture
def sampler() -> Iterator[Callable[..., Sampler]]:
    """Samplers on scripted probes, stopped after the test."""
    made: list[Sampler] = []

    def make(probe: Callable[[], Sample], interval: float = 0.05) -> Sampler:
        made.append(Sampler(interval=interval, probe=probe))
        return made[-1]

    yield make
    for each in made:
        each.stop()


@pytest.fixture
def magic_shell(shell, board) -> Iterator[Any]:
    """The shell fixture on a machine without GPU; its dashboards are stopped afterwards."""
    board("no-gpu")
    assert not shared_sampler().running, "an earlier test left the shared sampler running"
    yield shell
    shell.run_line_magic("dashboard", "stop")
    wait_for(lambda: not shared_sampler().running)


def all_widgets(widget: Any) -> list[Any]:
    """The widget and every widget inside it."""
    children = getattr(widget, "children", ())
    return [widget, *(inner for child in children for inner in all_widgets(child))]


def seen_values(read: Callable[[], object], wanted: int, timeout: float = 10.0) -> set[object]:
    """Distinct values ``read()`` gives, polled until there are ``wanted`` of them."""
    seen: set[object] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < wanted and time.monotonic() < deadline:
        seen.add(read())
        time.sleep(0.005)
    return seen


def sampler_threads() -> int:
    return sum(thread.name == "ipycloud-sampler" for thread in threading.enumerate())


def test_the_panel_follows_the_sampler(sampler) -> None:
    probe = ScriptedProbe(cpu=(10.0, 50.0, 90.0))
    dashboard = Dashboard(sampler(probe), interval=0.1, history=5).start()
    assert dashboard.active and dashboard.status.value.startswith("live, every 0.1 s")
    assert seen_values(lambda: dashboard.cpu_bar.value, 3) == {10.0, 50.0, 90.0}
    assert dashboard.rows["cpu"].texts[0].value in {"10%", "50%", "90%"}
    probe.ram_used = 12 * GIB
    wait_for(lambda: dashboard.ram_bar.value == 75.0)
    assert dashboard.rows["ram"].texts[0].value == "75% · 12.0 GiB of 16.0 GiB"
    assert dashboard.rows["ram"].detail.value == ("host RAM 16.0 GiB, this kernel 1.0 GiB, "
                                                  "swap 0 MiB of 2048 MiB")
    assert list(dashboard.rows) == ["cpu", "ram", "disk:working"]


def test_gpu_rows_come_from_nvml_through_take_sample(sampler, board) -> None:
    t4 = dataclasses.replace(BOARDS["1xT4"].gpus[0])  # a copy this test may change
    board(FakeBoard([t4, dataclasses.replace(t4, uuid=t4.uuid[:-1] + "9")]))
    from ipycloud.runtime.monitor.probe import take_sample

    dashboard = Dashboard(sampler(take_sample, interval=0.1), interval=0.1, history=60).start()
    assert list(dashboard.rows)[:2] == ["gpu0", "gpu1"]
    row = dashboard.rows["gpu0"]
    assert row.label.value == "GPU 0" and [bar.description for bar in row.bars] == [
        "util", "memory"]
    assert row.detail.value == "Tesla T4, 43 °C, 9 of 70 W"
    assert row.bars[1].bar_style == ""
    t4.utilization, t4.memory_used_mib = (73, 20), 14_000  # 91% of 15,360 MiB
    wait_for(lambda: row.bars[0].value == 73.0 and row.bars[1].bar_style == "danger")
    assert row.texts[1].value == "91% · 13.7 GiB of 15.0 GiB"
    assert dashboard.rows["gpu1"].bars[1].bar_style == ""  # the other board is untouched
    assert 'points="' in row.sparkline.value and "#ff7f0e" in row.sparkline.value


def test_dashboards_share_one_sampler_and_stop_on_their_own(sampler) -> None:
    probe = ScriptedProbe(cpu=(20.0, 40.0, 60.0, 80.0))
    shared = sampler(probe, interval=1.0)
    before = sampler_threads()
    first = Dashboard(shared, interval=0.1, history=5).start()
    second = Dashboard(shared, interval=0.2, history=5).start()
    assert sampler_threads() == before + 1 and shared.interval == 0.1
    for dashboard in (first, second):
        assert len(seen_values(lambda d=dashboard: d.cpu_bar.value, 2)) == 2

    first.stop_button.click()
    assert not first.active and first.status.value == "stopped"
    assert first.stop_button.disabled
    probe.wait_for_readings(2)  # a sample in flight at the click has landed
    frozen = first.cpu_bar.value
    assert len(seen_values(lambda: second.cpu_bar.value, 3)) == 3
    assert first.cpu_bar.value == frozen
    assert shared.running and second.active and shared.interval == 0.2

    second.stop()
    wait_for(lambda: not shared.running)  # no dashboard left: the thread ends


def test_a_new_dashboard_draws_the_history_the_sampler_already_has(sampler) -> None:
    probe = ScriptedProbe(cpu=(10.0, 90.0))
    shared = sampler(probe, interval=0.05)
    shared.subscribe(lambda sample: None)  # another user keeps the sampler running
    probe.wait_for_readings(6)
    dashboard = Dashboard(shared, interval=0.1, history=1)  # not started: no new samples
    (line,) = points(dashboard.rows["cpu"].sparkline.value)
    assert {y for _, y in line} == {y_of(10.0), y_of(90.0)}


def test_only_changed_traits_are_set_on_an_idle_machine(sampler) -> None:
    probe = ScriptedProbe(cpu=(5.0, 5.2, 4.9), wobble=4096)  # idle: figures barely move
    dashboard = Dashboard(sampler(probe), interval=0.1, history=0.5).start()
    changes: list[str] = []
    for widget in all_widgets(dashboard.widget):
        widget.observe(lambda change: changes.append(change["name"]), names=traitlets.All)
    probe.wait_for_readings(12)  # the sparklines' window is full: they stop growing
    changes.clear()
    probe.wait_for_readings(8)
    assert changes == []
    probe.cpu = (5.0, 95.0)  # the control: a busy machine does change the panel
    wait_for(lambda: "value" in changes)


@pytest.mark.parametrize(
    ("percent", "expected"),
    [(None, ""), (0.0, ""), (WARNING_AT - 0.1, ""), (WARNING_AT, "warning"),
     (DANGER_AT - 0.1, "warning"), (DANGER_AT, "danger"), (100.0, "danger")],
)
def test_warning_levels(percent: float | None, expected: str) -> None:
    assert level(percent) == expected


EM_PER_CHARACTER = 0.6  # above the mean advance of digits and letters in UI sans fonts


def test_the_longest_ram_text_fits_the_column_and_none_is_cut() -> None:
    """RAM full at the largest limit of each unit (just under 4 GiB: MiB; just under 4 TiB:
    GiB; 16 TiB) gives the longest texts the column must hold; a longer one (a disk's)
    widens its row instead of being cut."""
    texts = []
    for limit in (4 * GIB - 2**20, 4096 * GIB - 2**27, 16 * 1024 * GIB):
        full = Sample(time=0.0, cpu_percent=100.0, ram_used=limit, ram_limit=limit,
                      ram_available=0, swap_used=0, swap_total=0, process_rss=limit)
        (ram,) = [reading for reading in readings(full) if reading.key == "ram"]
        texts.append(ram.gauges[0].text)
    longest = max(texts, key=len)
    assert longest == "100% · 4095.9 GiB of 4095.9 GiB"
    assert float(TEXT_WIDTH.removesuffix("em")) >= len(longest) * EM_PER_CHARACTER
    dashboard = Dashboard(Sampler(probe=ScriptedProbe()), interval=0.1, history=5)
    for row in dashboard.rows.values():
        for text in [row.label, *row.texts]:  # at least their column's width, or wider
            assert text.layout.min_width is not None and text.layout.width is None
            assert text.layout.flex == "0 0 auto"  # never shrunk by a long detail beside it
        assert [text.layout.min_width for text in row.texts] == [TEXT_WIDTH] * len(row.texts)


def test_bars_turn_amber_and_red_near_memory_and_disk_limits_only(sampler) -> None:
    gpu = GpuSample(0, "Fake GPU", 100.0, 13 * GIB, 16 * GIB, 80.0, 250.0, 300.0)  # 81%
    probe = ScriptedProbe(cpu=(100.0,), ram_used=int(16 * GIB * 0.79), disk_used=95 * GIB,
                          gpus=(gpu,))
    dashboard = Dashboard(sampler(probe), interval=0.1, history=5)  # the first reading only
    styles = {key: [bar.bar_style for bar in row.bars] for key, row in dashboard.rows.items()}
    assert styles == {"gpu0": ["", "warning"], "cpu": [""], "ram": [""],
                      "disk:working": ["danger"]}
    probe.ram_used = int(16 * GIB * 0.9)
    dashboard.start()
    wait_for(lambda: dashboard.ram_bar.bar_style == "danger")


def points(svg: str) -> list[list[tuple[float, float]]]:
    """Each polyline's points."""
    return [[tuple(map(float, pair.split(","))) for pair in line.split()]  # type: ignore[misc]
            for line in re.findall(r'points="([^"]*)"', svg)]


def y_of(percent: float) -> float:
    return round(HEIGHT - 1 - percent / 100 * (HEIGHT - 2), 1)


def test_sparkline_shows_the_window_and_forgets_what_left_it() -> None:
    trace = Trace(window=60, series=1)
    trace.add(1000.0, [100.0])  # a spike
    for second in range(1, 31):
        trace.add(1000.0 + second, [0.0])
    (line,) = points(trace.svg())
    assert line[0] == (61.0, y_of(100.0))  # the spike, 30 s before the newest: mid-picture
    assert line[-1] == (WIDTH, y_of(0.0))  # the newest sample at the right edge
    for second in range(31, 91):
        trace.add(1000.0 + second, [0.0])
    assert len(trace) == 61  # the window's samples plus the one just before it
    assert points(trace.svg()) == [[(0.0, y_of(0.0)), (WIDTH, y_of(0.0))]]  # flat: two ends


def test_sparkline_keeps_the_peak_of_each_pixel_and_skips_unknowns() -> None:
    # 600 s over 120 pixels: five seconds a pixel; the last pixel holds t = 595..600
    history = [(float(t), (10.0, None)) for t in range(590, 596)] + [(596.0, (70.0, None)),
                                                                      (597.0, (20.0, None))]
    svg = sparkline_svg(history, 600, 2, title="GPU 0 <util>")
    utilisation, memory = points(svg)
    assert utilisation[-1] == (WIDTH, y_of(70.0)) and memory == []
    assert "<title>GPU 0 &lt;util&gt;</title>" in svg


def test_a_long_history_keeps_one_point_per_pixel_column() -> None:
    """A day at 1 Hz folds into at most a point per column (plus the edges): a redraw costs
    the same as for a minute, and each column still shows its peak."""
    day = 86400
    trace = Trace(window=day, series=2)
    for second in range(2 * day):  # two days: the first has left the window
        spike = second % 3600 == 1800  # one busy second an hour
        trace.add(float(second), [100.0 if spike else 5.0, None])
    assert len(trace) <= WIDTH + 2
    utilisation, memory = points(trace.svg())
    assert memory == []
    assert sorted({y for _, y in utilisation}) == [y_of(100.0), y_of(5.0)]
    assert sum(y == y_of(100.0) for _, y in utilisation) == 24  # every hour's spike is seen
    assert utilisation[-1] == (WIDTH, y_of(5.0))


def test_text_view_and_live_refusal_without_ipywidgets(magic_shell, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if it were not installed
    text = str(magic_shell.run_line_magic("dashboard", "--text"))
    lines = text.splitlines()
    assert lines[0].endswith("(one reading; %dashboard shows them live)")
    assert [line.split()[0] for line in lines[2:4]] == ["CPU", "RAM"]
    assert "disk working" in text
    with pytest.raises(UsageError) as caught:
        magic_shell.run_line_magic("dashboard", "--interval 0.5")
    assert str(caught.value) == (
        "%dashboard: ipywidgets is required for this feature: pip install 'ipycloud[widgets]'; "
        "or run %dashboard --text for a one-shot text view (%dashboard --text --cells also "
        "records each cell)")
    assert not shared_sampler().running


def test_without_ipywidgets_the_cells_table_leads_to_a_line_that_works(
        magic_shell, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if it were not installed
    with pytest.raises(UsageError) as caught:
        magic_shell.run_line_magic("dashboard", "cells")
    assert str(caught.value) == ("%dashboard cells: no cells recorded: start recording with "
                                 "%dashboard --text --cells")
    magic_shell.run_line_magic("dashboard", "--text --cells")
    empty = magic_shell.run_line_magic("dashboard", "cells")
    assert str(empty) == ("no cells recorded yet: start recording with %dashboard --text "
                          "--cells, then run cells")
    magic_shell.run_cell("x = 1")
    table = str(magic_shell.run_line_magic("dashboard", "cells")).splitlines()
    assert table[1].split()[:4] == ["[1]", "x", "=", "1"]
    magic_shell.run_line_magic("dashboard", "stop")


def test_a_terminal_ipython_is_told_to_use_the_text_view() -> None:
    result = terminal_ipython(["%load_ext ipycloud", "%dashboard", "%dashboard --text"])
    assert result.stderr.splitlines() == [
        "UsageError: %dashboard: a terminal cannot show the live panel; use %dashboard --text "
        "for a reading as text"]
    assert "(one reading; %dashboard in a notebook shows them live)" in result.stdout
    assert "Traceback" not in result.stdout


def test_text_view_rows_and_levels() -> None:
    gpu = GpuSample(0, "Tesla T4", None, 14 * GIB, 15 * GIB, None, None, None)
    sample = Sample(time=0.0, cpu_percent=12.0, ram_used=13 * GIB, ram_limit=16 * GIB,
                    ram_available=3 * GIB, swap_used=0, swap_total=0, process_rss=GIB,
                    gpus=(gpu,), ram_limited=True)
    lines = text_view(sample).splitlines()
    assert lines[1].split() == ["resource", "gauge", "use", "amount", "level", "detail"]
    assert lines[2].split()[:5] == ["GPU", "0", "util", "n/a", "["]
    assert "93%  [######### ]  14.0 GiB of 15.0 GiB  danger" in lines[3]
    assert "81%  [########  ]  13.0 GiB of 16.0 GiB  warning  container limit 16.0 GiB" in (
        lines[5])
    assert lines[-1] == ("level: warning from 80% of a memory or disk limit, danger from 90%")
    assert [reading.key for reading in readings(sample)] == ["gpu0", "cpu", "ram"]


def test_the_magic_shows_a_live_panel_records_cells_and_stops(magic_shell) -> None:
    dashboard = magic_shell.run_line_magic("dashboard", "--interval 0.1 --history 2s --cells")
    assert isinstance(dashboard, Dashboard) and dashboard.active
    bundle = dashboard._repr_mimebundle_()
    assert bundle[WIDGET_VIEW]["model_id"] == dashboard.widget.model_id
    # the persistent folder (the home) has a row of its own only on another file system
    assert bundle["text/plain"].startswith("<Dashboard live, every 0.1 s, rows cpu, ram, "
                                           "disk:working")
    assert len(seen_values(lambda: dashboard.rows["cpu"].sparkline.value, 3)) == 3
    magic_shell.run_cell("x = sum(range(10**6))", store_history=True)
    table = magic_shell.run_line_magic("dashboard", "cells")
    assert "x = sum(range(10**6))" in str(table)

    notice = str(magic_shell.run_line_magic("dashboard", "stop"))
    assert notice.startswith("stopped 1 dashboard and per-cell recording")
    assert not dashboard.active and dashboard.status.value == "stopped"
    wait_for(lambda: not shared_sampler().running)
    assert str(magic_shell.run_line_magic("dashboard", "stop")).startswith(
        "stopped 0 dashboards;")


def test_stopping_the_dashboards_leaves_usage_recording_on(magic_shell) -> None:
    magic_shell.run_line_magic("config", "UsageRecording.enabled = True")
    magic_shell.run_line_magic("dashboard", "--interval 0.1")
    notice = str(magic_shell.run_line_magic("dashboard", "stop"))
    assert notice == ("stopped 1 dashboard; usage recording goes on once a second "
                      "(%config UsageRecording.enabled = False stops it)")
    assert shared_sampler().running and shared_sampler().subscribers == 1
    assert shared_sampler().interval == DEFAULT_INTERVAL_S  # the session's own pace again
    magic_shell.run_line_magic("config", "UsageRecording.enabled = False")


def test_the_report_as_text_json_and_csv(magic_shell, tmp_path: Path) -> None:
    dashboard = magic_shell.run_line_magic("dashboard", "--interval 0.1")
    wait_for(lambda: shared_tracker().samples >= 3)
    dashboard.stop()
    magic_shell.run_line_magic("dashboard", "stop")
    wait_for(lambda: not shared_sampler().running)  # the totals stop growing
    report = magic_shell.run_line_magic("dashboard", "report")
    assert isinstance(report, UsageReport) and report.samples >= 3
    assert str(report).startswith("Session ")
    assert report.cost is None  # this machine is no instance of the price table
    instance = next(line for line in str(report).splitlines() if line.startswith("Instance"))
    assert instance.endswith("; pass --instance KEY with a key of the price table")
    assert "; pass instance= with a key of the price table" in str(usage_report())  # Python's
    as_json = magic_shell.run_line_magic("dashboard", "report --json")
    assert as_json.data == report.to_dict() == json.loads(str(as_json))
    notice = str(magic_shell.run_line_magic("dashboard", f"report --csv {tmp_path / 'u.csv'}"))
    assert notice == f"wrote the usage report to {tmp_path / 'u.csv'}"
    rows = (tmp_path / "u.csv").read_text().splitlines()
    assert rows[0] == "section,item,field,value" and f"session,,samples,{report.samples}" in rows
    with pytest.raises(UsageError, match=r"^%dashboard report: unknown instance 'nope' "):
        magic_shell.run_line_magic("dashboard", "report --instance nope")


def test_a_report_without_samples_is_one_line(magic_shell) -> None:
    with pytest.raises(UsageError) as caught:
        magic_shell.run_line_magic("dashboard", "report")
    assert str(caught.value) == ("%dashboard report: no samples recorded yet: start monitoring "
                                 "with %dashboard (or "
                                 "ipycloud.runtime.monitor.session.start_monitoring())")


@pytest.fixture
def recorded(magic_shell) -> Any:
    """The magic shell with a few readings recorded and its sampler stopped."""
    dashboard = magic_shell.run_line_magic("dashboard", "--interval 0.1")
    wait_for(lambda: shared_tracker().samples >= 2)
    dashboard.stop()
    magic_shell.run_line_magic("dashboard", "stop")
    return magic_shell


def test_the_csv_report_replaces_no_folder_device_or_pipe(recorded, tmp_path: Path) -> None:
    pipe, folder = tmp_path / "a pipe", tmp_path / "u.csv"
    os.mkfifo(pipe)
    folder.mkdir()
    for target in (pipe, folder):
        with pytest.raises(UsageError) as caught:
            recorded.run_line_magic("dashboard", f"report --csv {shlex.quote(str(target))}")
        assert str(caught.value) == (f"%dashboard report: cannot write {target}: it is a "
                                     "folder, a device or a pipe, not a file; give another "
                                     "with --csv")
    assert stat.S_ISFIFO(pipe.lstat().st_mode) and folder.is_dir()
    assert sorted(tmp_path.iterdir()) == [pipe, folder]


@pytest.mark.parametrize("below", ["", "/reports"])
def test_a_csv_below_a_file_is_one_line(recorded, tmp_path: Path, below) -> None:
    file = tmp_path / "notes 'v1'.txt"
    file.write_text("mine")
    target = f"{file}{below}/u.csv"
    with pytest.raises(UsageError) as caught:
        recorded.run_line_magic("dashboard", f"report --csv {shlex.quote(target)}")
    assert str(caught.value) == (f"%dashboard report: cannot write {target}: {file} is a "
                                 "file, not a folder; give another with --csv")
    assert file.read_text() == "mine" and list(tmp_path.iterdir()) == [file]


def test_a_csv_name_too_long_is_one_line(recorded, tmp_path: Path) -> None:
    target = tmp_path / ("u" * 300 + ".csv")
    with pytest.raises(UsageError) as caught:
        recorded.run_line_magic("dashboard", f"report --csv {target}")
    assert str(caught.value) == (f"%dashboard report: cannot use {target}: a name in its "
                                 "path is too long for its file system; give a shorter one "
                                 "with --csv")


def test_a_csv_in_a_read_only_folder_is_one_line(recorded, read_only_folder: Path) -> None:
    with pytest.raises(UsageError) as caught:
        recorded.run_line_magic("dashboard", f'report --csv "{read_only_folder}/u.csv"')
    assert str(caught.value) == (f"%dashboard report: cannot use {read_only_folder}/u.csv: "
                                 "read-only file system; give one on a writable disk with "
                                 "--csv")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--bogus", "%dashboard: unknown option --bogus (see %dashboard? for usage)"),
        ("bogus", "argument action: invalid choice: 'bogus'"),
        ('"unclosed', "No closing quotation"),
        ("--interval -1", "%dashboard: argument --interval: '-1' is not a duration: write it "
                          "like 90s"),
        ("--interval -1m", "%dashboard: argument --interval: '-1m' is not a duration: write it "
                           "like 90s"),
        ("--interval 0", "%dashboard: argument --interval: '0' is not a positive duration"),
        ("--interval nan", "%dashboard: argument --interval: 'nan' is not a duration"),
        ("--interval 7200", "%dashboard: interval must be a number of seconds from 0.1 to "
                            "3600, not 7200"),
        ("--interval 0.01", "interval must be a number of seconds from 0.1 to 3600, not 0.01"),
        ("--interval 2h", "interval must be a number of seconds from 0.1 to 3600, not 7200"),
        ("--history 5x", "%dashboard: argument --history: '5x' is not a duration"),
        ("--history 1 --interval 2", "the history must be longer than the interval (2 s)"),
        ("--history 2d", "the history must be longer than the interval (1 s) and at most 24 h"),
        ("--text --interval 2", "--interval and --history are for the live panel, not --text"),
        ("--json", "%dashboard: --json does not apply to a live dashboard"),
        ("stop --cells", "%dashboard: --cells does not apply to stop"),
        ("report --text", "%dashboard: --text does not apply to report"),
        ("report --json --csv u.csv", "%dashboard report: --json and --csv do not go together"),
        ("cells", "%dashboard cells: no cells recorded: start recording with %dashboard --cells"),
    ],
)
def test_wrong_lines_are_one_line_usage_errors(magic_shell, line: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        magic_shell.run_line_magic("dashboard", line)
    text = str(caught.value)
    assert message in text and text.startswith("%dashboard") and "\n" not in text
    assert not shared_sampler().running  # a mistake starts nothing


def test_the_dashboard_in_a_real_kernel(tmp_path: Path) -> None:
    """The sampler thread updates the widget models of a real kernel, and the comm carries it;
    once stopped, the output the panel was shown in holds a snapshot instead of the widget,
    whose model a notebook saved later no longer has."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        "%load_ext ipycloud",
        "d = %dashboard --interval 0.2 --history 10s",
        "d",
        # read the widgets from the kernel while it allocates 300 MB: the values move
        "import json, time\n"
        "def reading():\n"
        "    return {'rss': d.rows['ram'].detail.value, 'cpu': d.cpu_bar.value,\n"
        "            'sparkline': d.rows['cpu'].sparkline.value}\n"
        "first = reading()\n"
        "block = b'x' * 300_000_000\n"
        "deadline = time.monotonic() + 20\n"
        "while reading()['rss'] == first['rss'] and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(json.dumps({'first': first, 'later': reading(), 'active': d.active,\n"
        "                  'comm': type(d.widget.comm).__name__,\n"
        "                  'ram_model': d.rows['ram'].detail.model_id,\n"
        "                  'panel_model': d.widget.model_id}))",
        "%dashboard stop",
    )]
    cells = execute(notebook, tmp_path).cells
    (shown,) = cells[2].outputs
    assert WIDGET_VIEW not in shown.data  # replaced when the panel stopped
    assert re.fullmatch(r'<div class="ipycloud-snapshot"><p><b>ipycloud dashboard at [\d :-]+ '
                        r"\(the live panel stopped\)</b></p><table>.*</table></div>",
                        shown.data["text/html"])
    assert "this kernel" in shown.data["text/html"]  # the RAM row's figures
    assert shown.data["text/plain"].startswith("ipycloud dashboard at ")
    result = json.loads(outputs(cells[3])["stdout"])
    first, later = result["first"], result["later"]
    assert result["active"] and result["comm"] != "DummyComm"
    rss = [float(re.search(r"this kernel ([\d.]+) MiB", reading["rss"])[1])  # type: ignore[index]
           for reading in (first, later)]
    assert rss[1] - rss[0] > 250  # the 300 MB block, seen by the sampler thread
    assert later["sparkline"] != first["sparkline"]
    state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    assert result["panel_model"] in state  # the panel the client was shown
    ram_label = state[result["ram_model"]]["state"]["value"]  # updates reached the client
    assert ram_label != first["rss"] and "this kernel" in ram_label
    assert outputs(cells[4])["text/plain"].startswith("stopped 1 dashboard")


def test_widgets_only_come_from_the_first_reading(sampler) -> None:
    """A GPU that appears later gets no row: the thread never creates widgets."""
    probe = ScriptedProbe()
    dashboard = Dashboard(sampler(probe), interval=0.1, history=5).start()
    created: list[Any] = []
    widgets.Widget.on_widget_constructed(created.append)
    try:
        probe.gpus = (GpuSample(0, "Hot-plugged", 50.0, GIB, 16 * GIB, None, None, None),)
        probe.wait_for_readings(3)
    finally:
        widgets.Widget._widget_construction_callback = None
    assert created == [] and "gpu0" not in dashboard.rows
