"""Per-cell resource use, recorded from a real IPython shell's cell events and a real sampler."""

from __future__ import annotations

import ast
import dataclasses
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
from fake_nvml import BOARDS
from IPython.core.interactiveshell import InteractiveShell
from kernels import execute, outputs
from waiting import wait_for

from ipycloud.runtime.monitor.cells import (
    CellRecord,
    CellRecorder,
    CellTable,
    excerpt,
    format_change,
)
from ipycloud.runtime.monitor.sampler import Sampler
from ipycloud.runtime.monitor.samples import GpuSample, Sample

MIB = 2**20
GIB = 2**30


def run(shell: InteractiveShell, source: str) -> None:
    shell.run_cell(source, store_history=True)


def last(recorder: CellRecorder) -> CellRecord:
    return recorder.records[-1]


class ScriptedProbe:
    """A probe reporting the RSS and per-GPU memory a test sets; counts its readings."""

    def __init__(self, rss: int = GIB, gpus: tuple[int, ...] = ()) -> None:
        self.rss, self.gpus, self.readings = rss, gpus, 0
        self._lock = threading.Lock()

    def __call__(self) -> Sample:
        with self._lock:
            self.readings += 1
            gpus = tuple(GpuSample(index, "Fake GPU", 0.0, used, 16 * GIB, 40.0, 50.0, 300.0)
                         for index, used in enumerate(self.gpus))
            return Sample(time=time.time(), cpu_percent=0.0, ram_used=4 * GIB,
                          ram_limit=16 * GIB, ram_available=12 * GIB, swap_used=0,
                          swap_total=0, process_rss=self.rss, gpus=gpus)

    def wait_for_tick(self) -> None:
        """Until the sampler thread has read the current figures (after this call)."""
        seen = self.readings  # the reading in progress may have begun before the change
        wait_for(lambda: self.readings >= seen + 3)


@pytest.fixture
def recording(shell: InteractiveShell) -> Iterator[Callable[..., CellRecorder]]:
    """Start a recorder on the shell with a given sampler; stops both afterwards."""
    started: list[CellRecorder] = []

    def start(sampler: Sampler | None = None) -> CellRecorder:
        recorder = CellRecorder(shell, sampler or Sampler(interval=0.05))
        recorder.start()
        started.append(recorder)
        shell.user_ns.update(recorder=recorder, sampler=recorder.sampler)
        return recorder

    yield start
    for recorder in started:
        recorder.stop()
        recorder.sampler.stop()


def test_ram_peak_and_change_of_an_allocation_and_its_release(
        shell: InteractiveShell, recording: Callable[..., CellRecorder]) -> None:
    recorder = recording(Sampler(interval=3600))  # only the direct readings count here
    run(shell, "blob = bytearray(200 * 2**20)")
    allocated = last(recorder)
    assert 190 * MIB <= allocated.ram_change <= 260 * MIB
    assert allocated.ram_peak >= allocated.ram_change + 50 * MIB  # the interpreter was there
    run(shell, "del blob")
    released = last(recorder)
    assert -260 * MIB <= released.ram_change <= -190 * MIB
    assert released.ram_peak >= allocated.ram_peak - 10 * MIB  # held at the start
    assert [allocated.execution_count, released.execution_count] == [1, 2]
    assert not allocated.failed and not released.failed


def test_peak_between_start_and_end_comes_from_the_sampler_ticks(
        shell: InteractiveShell, recording: Callable[..., CellRecorder]) -> None:
    recorder = recording()
    run(shell, "import time\n"
               "blob = bytearray(200 * 2**20)\n"
               "allocated = time.time()\n"
               "while sampler.latest().time <= allocated:\n"
               "    time.sleep(0.01)\n"
               "del blob")
    record = last(recorder)
    assert abs(record.ram_change) < 20 * MIB
    baseline = recorder.sampler.sample_now().process_rss
    assert record.ram_peak >= baseline + 180 * MIB


def test_wall_time_failures_and_excerpts(
        shell: InteractiveShell, recording: Callable[..., CellRecorder]) -> None:
    recorder = recording()
    run(shell, "\n\nimport time\ntime.sleep(0.3)\n")
    run(shell, "1 / 0")
    run(shell, "def broken(:")
    run(shell, "   ")  # an empty cell: IPython fires post_run_cell alone
    run(shell, "total = sum(range(10)) + sum(range(20)) + sum(range(30)) + 1")
    sleep, division, syntax, long = recorder.records
    assert sleep.wall_s >= 0.3
    assert (sleep.excerpt, division.excerpt, syntax.excerpt) == (
        "import time …", "1 / 0", "def broken(:")
    assert long.excerpt == "total = sum(range(10)) + sum(range(20))…"
    assert [record.failed for record in recorder.records] == [False, True, True, False]


def test_excerpt_shortens_to_one_line() -> None:
    assert excerpt("x = 1") == "x = 1"
    assert excerpt("  # train\nfit()\n") == "# train …"
    assert excerpt("a" * 50, limit=10) == "aaaaaaaaa…"
    assert excerpt("") == ""


def test_start_twice_records_each_cell_once_and_stop_ends_recording(
        shell: InteractiveShell, recording: Callable[..., CellRecorder]) -> None:
    recorder = recording()
    recorder.start()
    assert shell.events.callbacks["pre_run_cell"].count(recorder._pre_run_cell) == 1
    run(shell, "a = 1")
    run(shell, "b = 2")
    assert [record.excerpt for record in recorder.records] == ["a = 1", "b = 2"]
    assert recorder.sampler.running
    recorder.stop()
    assert not recorder.recording
    wait_for(lambda: not recorder.sampler.running)  # our subscription was the only one
    run(shell, "c = 3")
    assert [record.excerpt for record in recorder.records] == ["a = 1", "b = 2"]
    recorder.stop()  # stopping again is harmless
    recorder.start()
    run(shell, "d = 4")
    assert [record.excerpt for record in recorder.records] == ["a = 1", "b = 2", "d = 4"]


def test_the_cell_that_starts_or_stops_recording_is_not_recorded(
        shell: InteractiveShell, recording: Callable[..., CellRecorder]) -> None:
    recorder = recording()
    recorder.stop()
    run(shell, "recorder.start()")
    run(shell, "x = 1")
    run(shell, "recorder.stop()")
    run(shell, "y = 2")
    assert [record.excerpt for record in recorder.records] == ["x = 1"]


def test_a_cell_run_by_a_cell_is_recorded_and_its_peak_counts_for_the_outer_one(
        shell: InteractiveShell, recording: Callable[..., CellRecorder]) -> None:
    recorder = recording(Sampler(interval=3600))
    run(shell, "get_ipython().run_cell('inner = bytearray(200 * 2**20)')\ndel inner")
    inner, outer = recorder.records
    assert inner.excerpt == "inner = bytearray(200 * 2**20)" and inner.ram_change > 190 * MIB
    assert outer.ram_peak >= inner.ram_peak and abs(outer.ram_change) < 20 * MIB


def test_only_the_last_records_are_kept(shell: InteractiveShell) -> None:
    recorder = CellRecorder(shell, Sampler(interval=3600), capacity=3)
    recorder.start()
    try:
        for number in range(5):
            run(shell, f"x = {number}")
    finally:
        recorder.stop()
    assert [record.excerpt for record in recorder.records] == ["x = 2", "x = 3", "x = 4"]
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        CellRecorder(shell, Sampler(), capacity=0)


def test_gpu_memory_from_nvml(shell: InteractiveShell, recording: Callable[..., CellRecorder],
                              board: Callable[..., types.ModuleType]) -> None:
    machine = dataclasses.replace(BOARDS["8xH100"], gpus=BOARDS["8xH100"].gpus[:2])
    machine.gpus = [dataclasses.replace(gpu) for gpu in machine.gpus]
    board(machine)
    recorder = recording(Sampler(interval=3600))
    shell.user_ns["gpus"] = machine.gpus
    run(shell, "gpus[1].memory_used_mib += 3000")
    run(shell, "gpus[1].memory_used_mib -= 1000")
    grew, shrank = recorder.records
    assert grew.gpu_source == "nvml"
    assert grew.gpu_change == 3000 * MIB and shrank.gpu_change == -1000 * MIB
    assert grew.gpu_peak == (1024 + 3000) * MIB  # summed over both GPUs: 0 + 1024 MiB before
    assert shrank.gpu_peak == (1024 + 3000) * MIB


def test_gpu_peak_between_ticks_from_a_scripted_probe(
        shell: InteractiveShell, recording: Callable[..., CellRecorder]) -> None:
    probe = ScriptedProbe(gpus=(GIB, 2 * GIB))
    recorder = recording(Sampler(interval=0.02, probe=probe))
    shell.user_ns["probe"] = probe
    run(shell, "probe.gpus = (6 * 2**30, 2 * 2**30); probe.rss = 3 * 2**30\n"
               "probe.wait_for_tick()\n"
               "probe.gpus = (2 * 2**30, 2 * 2**30); probe.rss = 2 * 2**30")
    record = last(recorder)
    assert (record.gpu_peak, record.gpu_change) == (8 * GIB, GIB)
    assert (record.ram_peak, record.ram_change) == (3 * GIB, GIB)


def test_without_a_gpu_the_gpu_columns_show_n_a(
        shell: InteractiveShell, recording: Callable[..., CellRecorder],
        board: Callable[..., types.ModuleType]) -> None:
    board("no-gpu")
    recorder = recording(Sampler(interval=3600))
    run(shell, "x = 1")
    record = last(recorder)
    assert (record.gpu_peak, record.gpu_change, record.gpu_source) == (None, None, None)
    lines = str(recorder.table()).splitlines()
    assert lines[1].split()[-3:] == ["n/a", "n/a", "ok"]
    assert lines[-1] == "GPU: no GPU seen"


class FakeAllocator:
    """torch.cuda's memory statistics as the caching allocator keeps them, for two devices."""

    def __init__(self) -> None:
        self.allocated, self.peak, self.resets = [GIB, 0], [GIB, 0], 0

    def allocate(self, device: int, size: int) -> None:
        self.allocated[device] += size
        self.peak[device] = max(self.peak[device], self.allocated[device])

    def reset_peak_memory_stats(self, device: int) -> None:
        self.resets += 1
        self.peak[device] = self.allocated[device]

    def module(self) -> types.ModuleType:
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
            is_initialized=lambda: True, device_count=lambda: 2,
            memory_allocated=lambda device: self.allocated[device],
            max_memory_allocated=lambda device: self.peak[device],
            reset_peak_memory_stats=self.reset_peak_memory_stats)
        return torch


def test_gpu_memory_from_torch_when_it_already_uses_cuda(
        shell: InteractiveShell, recording: Callable[..., CellRecorder],
        monkeypatch: pytest.MonkeyPatch) -> None:
    allocator = FakeAllocator()
    monkeypatch.setitem(sys.modules, "torch", allocator.module())
    recorder = recording(Sampler(interval=3600, probe=ScriptedProbe(gpus=(5 * GIB, 0))))
    shell.user_ns["allocator"] = allocator
    run(shell, "allocator.allocate(1, 4 * 2**30); allocator.allocate(1, -3 * 2**30)")
    run(shell, "allocator.allocate(0, -2**29)")
    spike, release = recorder.records
    assert allocator.resets == 4  # both devices, at the start of each cell
    assert (spike.gpu_source, spike.gpu_peak, spike.gpu_change) == ("torch", 5 * GIB, GIB)
    assert (release.gpu_peak, release.gpu_change) == (2 * GIB, -(2**29))
    assert "GPU: torch's CUDA allocator" in str(recorder.table())


def test_the_samples_torch_figures_spare_asking_torch(
        shell: InteractiveShell, recording: Callable[..., CellRecorder],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading taken at each end of a cell already holds torch's allocated bytes."""
    allocator = FakeAllocator()
    torch = allocator.module()
    asked: list[int] = []
    torch.cuda.memory_allocated = asked.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)

    def probe() -> Sample:
        gpus = tuple(GpuSample(index, "Fake GPU", 0.0, 8 * GIB, 16 * GIB, None, None, None,
                               torch_allocated=allocated)
                     for index, allocated in enumerate(allocator.allocated))
        return dataclasses.replace(ScriptedProbe()(), gpus=gpus)

    recorder = recording(Sampler(interval=3600, probe=probe))
    shell.user_ns["allocator"] = allocator
    run(shell, "allocator.allocate(1, 4 * 2**30); allocator.allocate(1, -3 * 2**30)")
    assert asked == []
    assert (last(recorder).gpu_peak, last(recorder).gpu_change) == (5 * GIB, GIB)


def record(**changes: object) -> CellRecord:
    fields: dict[str, object] = dict(
        execution_count=3, excerpt="x = <b>", started=0.0, wall_s=0.25, ram_peak=3 * GIB,
        ram_change=1288490189, gpu_peak=10 * GIB, gpu_change=-300 * MIB, gpu_source="nvml",
        failed=False)
    return CellRecord(**{**fields, **changes})  # type: ignore[arg-type]


def test_table_text_and_html() -> None:
    table = CellTable([record(), record(execution_count=12, excerpt="1 / 0", wall_s=75.0,
                                        ram_change=0, failed=True)])
    lines = str(table).splitlines()
    assert lines[:3] == [
        "cell  source   wall        peak RAM  RAM change  peak GPU  GPU change  status",
        "[3]   x = <b>  0.25 s      3.0 GiB   +1.2 GiB    10.0 GiB  -300.0 MiB  ok",
        "[12]  1 / 0    1 min 15 s  3.0 GiB   0 B         10.0 GiB  -300.0 MiB  failed",
    ]
    assert lines[3:] == ["", "RAM: this process's resident memory (RSS)",
                         "GPU: memory used on the device by all processes (NVML)"]
    page = table._repr_html_()
    assert "<th>peak GPU</th>" in page and "<td>x = &lt;b&gt;</td>" in page
    assert "<td>+1.2 GiB</td>" in page and "<td>failed</td>" in page


def test_table_with_nothing_recorded_says_how_to_start() -> None:
    assert str(CellTable([], start_hint="%dashboard --cells")) == (
        "no cells recorded yet: start recording with %dashboard --cells, then run cells")
    assert str(CellTable([])) == (  # in Python's words unless a front gives its own
        "no cells recorded yet: start recording with CellRecorder.start(), then run cells")
    assert CellTable([])._repr_html_() == f"<p>{CellTable([])}</p>"
    assert [format_change(value) for value in (None, 0, 5, -2 * GIB)] == [
        "n/a", "0 B", "+5 B", "-2.0 GiB"]


def test_cells_recorded_in_a_real_kernel(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        "%load_ext ipycloud\n"
        "from ipycloud.runtime.monitor.cells import CellRecorder\n"
        "from ipycloud.runtime.monitor.sampler import shared_sampler\n"
        "recorder = CellRecorder(get_ipython(), shared_sampler())\n"
        "recorder.start()",
        "blob = bytearray(100 * 2**20)",
        "import time\ntime.sleep(0.2)",
        "1 / 0",
        "del blob",
        "recorder.stop()\n"
        "print([(r.execution_count, r.failed, r.ram_change // 2**20) for r in recorder.records])",
        "print(recorder.table())",
        "recorder.table()",
    )]
    notebook.cells[3].metadata["tags"] = ["raises-exception"]
    cells = execute(notebook, tmp_path).cells
    figures = ast.literal_eval(outputs(cells[5])["stdout"])
    assert [(count, failed) for count, failed, _ in figures] == [
        (2, False), (3, False), (4, True), (5, False)]
    assert 95 <= figures[0][2] <= 130 and -130 <= figures[3][2] <= -95
    text = outputs(cells[6])["stdout"].splitlines()
    assert text[0].split() == ["cell", "source", "wall", "peak", "RAM", "RAM", "change", "peak",
                               "GPU", "GPU", "change", "status"]
    assert text[1].startswith("[2]") and "bytearray(100 * 2**20)" in text[1]
    assert text[3].startswith("[4]") and text[3].endswith("failed")
    assert "GPU: no GPU seen" in text
    shown = outputs(cells[7])
    assert "<table>" in shown["text/html"] and "<td>import time …</td>" in shown["text/html"]
