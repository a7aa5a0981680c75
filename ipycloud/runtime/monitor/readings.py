"""A sample as the rows a person reads: one per GPU, CPU, RAM and disk, with warning levels.

The live dashboard (``ipycloud.widgets``) and the one-shot text view (``textview``) both
show these rows, so the two always agree on figures, wording and colours.

Warning levels apply to gauges whose 100% means running out (GPU memory, RAM, disk
space), not to utilisation, where 100% is what one pays for:

- ``"warning"`` (amber) from 80% of the limit (WARNING_AT),
- ``"danger"`` (red) from 90% (DANGER_AT).
"""

from __future__ import annotations

from dataclasses import dataclass

from ipycloud.runtime.monitor.samples import DiskSample, GpuSample, Sample
from ipycloud.runtime.units import format_bytes, format_of, format_percent

WARNING_AT = 80.0  # percent of a memory or disk limit
DANGER_AT = 90.0


def level(percent: float | None) -> str:
    """``"danger"`` from DANGER_AT percent, ``"warning"`` from WARNING_AT, else ``""``."""
    if percent is None or percent < WARNING_AT:
        return ""
    return "danger" if percent >= DANGER_AT else "warning"


@dataclass(frozen=True, slots=True)
class Gauge:
    """One bar: a percentage, and the amounts behind it."""

    name: str  # "util", "memory", "use", "used"
    percent: float | None  # 0-100; None when the machine cannot tell
    amount: str  # e.g. "3.0 GiB of 15.0 GiB"; "" when the percentage says it all
    limited: bool  # whether 100% means running out, so the bar warns near it

    @property
    def level(self) -> str:
        """The warning level of the whole percent shown: ``""``, ``"warning"``, ``"danger"``."""
        return level(self.rounded) if self.limited and self.percent is not None else ""

    @property
    def rounded(self) -> float:
        """The percentage to whole percent (0 when unknown): all a bar can show."""
        return float(round(self.percent)) if self.percent is not None else 0.0

    @property
    def percent_text(self) -> str:
        """The percentage to whole percent, or n/a."""
        return format_percent(self.percent)

    @property
    def text(self) -> str:
        """The percentage and the amount, as shown beside the bar."""
        return f"{self.percent_text} · {self.amount}" if self.amount else self.percent_text


@dataclass(frozen=True, slots=True)
class Reading:
    """One row: a resource, its gauges, and a line of detail."""

    key: str  # stable across samples: "gpu0", "cpu", "ram", "disk:working"
    label: str
    gauges: tuple[Gauge, ...]
    detail: str
    traced: bool  # whether the dashboard draws its recent history (GPUs and CPU)


def readings(sample: Sample) -> list[Reading]:
    """The rows for ``sample``: GPUs first, then CPU, RAM and each disk."""
    rows = [_gpu(gpu) for gpu in sample.gpus]
    rows.append(Reading("cpu", "CPU", (Gauge("use", sample.cpu_percent, "", False),), "",
                        traced=True))
    limit = "container limit" if sample.ram_limited else "host RAM"
    swap = (f", swap {format_of(sample.swap_used, sample.swap_total)}"
            if sample.swap_total else "")
    rows.append(Reading(
        "ram", "RAM",
        (Gauge("used", sample.ram_fraction * 100, format_of(sample.ram_used, sample.ram_limit),
               True),),
        f"{limit} {format_bytes(sample.ram_limit)}, this kernel "
        f"{format_bytes(sample.process_rss)}{swap}", traced=False))
    rows.extend(_disk(disk) for disk in sample.disks)
    return rows


def _gpu(gpu: GpuSample) -> Reading:
    fraction = gpu.memory_fraction
    memory = ("" if fraction is None else
              format_of(gpu.memory_used or 0, gpu.memory_total or 0))
    details = [gpu.name]
    if gpu.temperature is not None:
        details.append(f"{gpu.temperature:.0f} °C")
    if gpu.power_draw_w is not None:
        limit = f" of {gpu.power_limit_w:.0f}" if gpu.power_limit_w is not None else ""
        details.append(f"{gpu.power_draw_w:.0f}{limit} W")
    if gpu.torch_reserved is not None:
        details.append(f"torch reserved {format_bytes(gpu.torch_reserved)}")
    return Reading(
        f"gpu{gpu.index}", f"GPU {gpu.index}",
        (Gauge("util", gpu.utilization, "", False),
         Gauge("memory", None if fraction is None else fraction * 100, memory, True)),
        ", ".join(details), traced=True)


def _disk(disk: DiskSample) -> Reading:
    """df's figures: the bar is its Use%, the words what can still be written."""
    return Reading(f"disk:{disk.name}", f"disk {disk.name}",
                   (Gauge("used", disk.percent,
                          format_of(disk.available, disk.total, "free of"), True),),
                   ", ".join(disk.paths), traced=False)
