"""Per-cell resource use: wall time, peak RAM and peak GPU memory of each executed cell.

``%dashboard --cells`` starts a :class:`CellRecorder` on the shell; ``%dashboard cells``
shows its :class:`CellTable`. The recorder listens to IPython's ``pre_run_cell`` and
``post_run_cell`` events. RAM is this process's resident memory (RSS); GPU memory is summed
over the GPUs this process sees. Peaks come from the background sampler's ticks while the
cell runs plus one direct reading at its start and end, so a cell shorter than a tick still
gets a figure. When torch already uses CUDA at the start of a cell, its caching allocator's
exact peak is used instead (``torch.cuda.max_memory_allocated``, after
``reset_peak_memory_stats`` at the start of each cell: user code reading that peak sees it
reset per cell). torch is never imported here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ipycloud.runtime.machine.cuda_start import initialised_torch_cuda
from ipycloud.runtime.monitor.samples import Sample
from ipycloud.runtime.tables import Table, aligned_lines, html_table
from ipycloud.runtime.units import NA, format_bytes, format_duration

if TYPE_CHECKING:
    from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult

    from ipycloud.runtime.monitor.sampler import Sampler, Subscription

CAPACITY = 1000  # records kept per recorder, the oldest dropped first
EXCERPT_CHARS = 40
START_HINT = "CellRecorder.start()"  # how to start recording, unless the front says otherwise
GPU_SOURCES = {
    "torch": "torch's CUDA allocator in this process (max_memory_allocated)",
    "nvml": "memory used on the device by all processes (NVML)",
}


@dataclass(frozen=True, slots=True)
class CellRecord:
    """What one executed cell used; sizes in bytes, a figure the machine cannot give is None."""

    execution_count: int | None  # the In [n] number IPython gave the cell
    excerpt: str  # the first non-blank line of the source, shortened
    started: float  # time.time() at the start
    wall_s: float
    ram_peak: int  # this process's RSS
    ram_change: int  # RSS at the end minus at the start
    gpu_peak: int | None  # summed over GPUs
    gpu_change: int | None
    gpu_source: str | None  # "torch" or "nvml", see GPU_SOURCES; None without a GPU
    failed: bool  # the cell raised (or did not compile)


@dataclass
class _Running:
    """A cell between its pre_run_cell and post_run_cell; peaks grow as samples arrive."""

    info: ExecutionInfo
    started: float
    clock: float  # time.perf_counter() at the start
    ram_start: int
    ram_peak: int
    gpu_source: str | None
    gpu_start: int | None
    gpu_peak: int | None

    def observe(self, sample: Sample) -> None:
        """Raise the peaks to what ``sample`` shows (torch's peak is read at the end)."""
        self.ram_peak = max(self.ram_peak, sample.process_rss)
        if self.gpu_source == "nvml":
            self.gpu_peak = _max(self.gpu_peak, _nvml_used(sample))


class CellRecorder:
    """Records the resource use of every cell the shell runs while started.

    Keeps the last ``capacity`` records (default 1000, a few hundred kB). Subscribed to
    ``sampler`` only while started.
    """

    def __init__(self, shell: Any, sampler: Sampler, *, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 record, not {capacity}")
        self.shell = shell
        self.sampler = sampler
        self._records: deque[CellRecord] = deque(maxlen=capacity)
        self._running: list[_Running] = []  # innermost last: a cell may run cells
        self._lock = threading.Lock()
        self._subscription: Subscription | None = None
        self._registered = False

    @property
    def recording(self) -> bool:
        """Whether cells are being recorded."""
        return self._registered

    @property
    def records(self) -> list[CellRecord]:
        """The kept records, oldest first (a copy)."""
        return list(self._records)

    def start(self) -> None:
        """Record every cell run from now on; starting again changes nothing."""
        if not self._registered:
            self.shell.events.register("pre_run_cell", self._pre_run_cell)
            self.shell.events.register("post_run_cell", self._post_run_cell)
            self._registered = True
        if self._subscription is None or not self._subscription.active:
            self._subscription = self.sampler.subscribe(self._observe)

    def stop(self) -> None:
        """Stop recording and leave the sampler; the records are kept."""
        if self._registered:
            self.shell.events.unregister("pre_run_cell", self._pre_run_cell)
            self.shell.events.unregister("post_run_cell", self._post_run_cell)
            self._registered = False
        if self._subscription is not None:
            self._subscription.cancel()
            self._subscription = None
        with self._lock:
            self._running.clear()

    def table(self, start_hint: str = START_HINT) -> CellTable:
        """The records as a table for people."""
        return CellTable(self.records, start_hint)

    def _pre_run_cell(self, info: ExecutionInfo) -> None:
        sample = self.sampler.sample_now()
        cuda = initialised_torch_cuda()
        source: str | None = "torch"
        gpu: int | None
        if cuda is not None:
            for device in range(cuda.device_count()):
                cuda.reset_peak_memory_stats(device)
            gpu = _torch_allocated(sample, cuda)
        else:
            gpu = _nvml_used(sample)
            source = None if gpu is None else "nvml"
        running = _Running(info=info, started=time.time(), clock=time.perf_counter(),
                           ram_start=sample.process_rss, ram_peak=sample.process_rss,
                           gpu_source=source, gpu_start=gpu, gpu_peak=gpu)
        with self._lock:
            self._running.append(running)

    def _post_run_cell(self, result: ExecutionResult | None) -> None:
        ended = time.perf_counter()
        if result is None:  # run_cell itself failed
            return
        with self._lock:
            running = next((cell for cell in reversed(self._running)
                            if cell.info is result.info), None)
            if running is None:  # an empty cell, or the cell that started the recorder
                return
            self._running.remove(running)
        sample = self.sampler.sample_now()
        running.observe(sample)
        gpu_end: int | None
        if running.gpu_source == "torch":
            cuda = initialised_torch_cuda()
            gpu_end = _torch_allocated(sample, cuda)
            running.gpu_peak = _max(running.gpu_peak, sum(
                cuda.max_memory_allocated(device) for device in range(cuda.device_count())))
        else:
            gpu_end = _nvml_used(sample)
        with self._lock:
            for outer in self._running:  # a cell run by this cell: its peaks are the outer's too
                outer.ram_peak = max(outer.ram_peak, running.ram_peak)
                if outer.gpu_source == running.gpu_source:
                    outer.gpu_peak = _max(outer.gpu_peak, running.gpu_peak)
        self._records.append(CellRecord(
            execution_count=result.execution_count,
            excerpt=excerpt(running.info.raw_cell or ""),
            started=running.started, wall_s=ended - running.clock, ram_peak=running.ram_peak,
            ram_change=sample.process_rss - running.ram_start,
            gpu_peak=running.gpu_peak, gpu_change=_difference(gpu_end, running.gpu_start),
            gpu_source=running.gpu_source, failed=not result.success,
        ))

    def _observe(self, sample: Sample) -> None:
        """Sampler thread: raise the peaks of the cells running since before ``sample``."""
        with self._lock:
            for running in self._running:
                if sample.time >= running.started:
                    running.observe(sample)


class CellTable:
    """Records as a compact table: aligned text (``str``) and HTML for notebooks."""

    HEADERS = ("cell", "source", "wall", "peak RAM", "RAM change", "peak GPU", "GPU change",
               "status")

    def __init__(self, records: Sequence[CellRecord], start_hint: str = START_HINT) -> None:
        self.records = list(records)
        self.start_hint = start_hint

    @property
    def empty_message(self) -> str:
        """What the table says while nothing is recorded."""
        return f"no cells recorded yet: start recording with {self.start_hint}, then run cells"

    def rows(self) -> Table:
        """Headers and one row of text per record."""
        rows = [[
            NA if record.execution_count is None else f"[{record.execution_count}]",
            record.excerpt, format_wall(record.wall_s),
            format_bytes(record.ram_peak), format_change(record.ram_change),
            format_bytes(record.gpu_peak), format_change(record.gpu_change),
            "failed" if record.failed else "ok",
        ] for record in self.records]
        return self.HEADERS, rows

    def notes(self) -> list[str]:
        """What the RAM and GPU columns measure."""
        sources = sorted({record.gpu_source for record in self.records if record.gpu_source})
        gpu = "; ".join(GPU_SOURCES[source] for source in sources) or "no GPU seen"
        return ["RAM: this process's resident memory (RSS)", f"GPU: {gpu}"]

    def __str__(self) -> str:
        if not self.records:
            return self.empty_message
        return "\n".join([*aligned_lines(*self.rows()), "", *self.notes()])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        if not self.records:
            return f"<p>{self.empty_message}</p>"
        notes = "<br>".join(self.notes())
        return f"{html_table(self.rows())}<p><small>{notes}</small></p>"


def excerpt(source: str, limit: int = EXCERPT_CHARS) -> str:
    """The first non-blank line of ``source``, with "…" when anything is left out."""
    lines = [line.strip() for line in source.strip().splitlines()]
    first = lines[0] if lines else ""
    if len(first) > limit:
        return first[:limit - 1].rstrip() + "…"
    return first + " …" if len(lines) > 1 else first


def format_wall(seconds: float) -> str:
    """Seconds as ``0.31 s``, ``12.4 s`` or ``2 min 5 s``; an hour or more as ``1 h 30 min``."""
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s"
    return format_duration(seconds)


def format_change(value: int | None) -> str:
    """A signed size: ``+1.2 GiB``, ``-300.0 MiB``, ``0 B``; None as n/a."""
    if value is None:
        return NA
    sign = "+" if value > 0 else "-" if value < 0 else ""
    return sign + format_bytes(abs(value))


def _nvml_used(sample: Sample) -> int | None:
    used = [gpu.memory_used for gpu in sample.gpus if gpu.memory_used is not None]
    return sum(used) if used else None


def _torch_allocated(sample: Sample, cuda: Any) -> int:
    """What torch's allocator holds over every device: the sample's figures when it has
    them, else asked of torch."""
    figures = [gpu.torch_allocated for gpu in sample.gpus if gpu.torch_allocated is not None]
    if figures:
        return sum(figures)
    return sum(cuda.memory_allocated(device) for device in range(cuda.device_count()))


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _difference(end: int | None, start: int | None) -> int | None:
    return None if end is None or start is None else end - start
