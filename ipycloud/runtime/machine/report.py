"""The environment report: one model of a Snapshot rendered as HTML, aligned text or JSON.

The report is a rich object: Jupyter shows ``_repr_html_``, a terminal IPython shows
``_repr_pretty_``, ``str()`` gives the same text, and ``to_json()`` the full data.
"""

from __future__ import annotations

import html
import json
from typing import Any, Protocol

from ipycloud.runtime.machine.nvml import GpuInfo
from ipycloud.runtime.machine.snapshot import Snapshot, take_snapshot
from ipycloud.runtime.tables import Table, aligned_lines, html_pairs, html_table, label_lines
from ipycloud.runtime.units import NA, format_bytes, format_duration, format_of, format_percent


def _value(value: object, unit: str = "") -> str:
    if value is None:
        return NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        value = f"{value:.0f}"
    return f"{value}{unit}"


def _pair(used: object, total: object, unit: str) -> str:
    if used is None and total is None:
        return NA
    return f"{_value(used)} / {_value(total)}{unit}"


def _gpu_memory(gpu: GpuInfo) -> str:
    if gpu.memory_total is None:
        return NA
    text = f"{format_bytes(gpu.memory_used)} / {format_bytes(gpu.memory_total)}"
    if gpu.memory_used is not None and gpu.memory_total:
        text += f" ({format_percent(100 * gpu.memory_used / gpu.memory_total)})"
    return text


def _mig(gpu: GpuInfo) -> str:
    if gpu.mig_enabled is None:
        return NA
    if not gpu.mig_enabled:
        return "off"
    return f"on, {len(gpu.mig_devices)} instances"


class EnvironmentReport:
    """The hardware and software report shown by ``%gpuinfo`` and ``ipycloud info``."""

    GPU_HEADERS = ("#", "Name", "Memory used / total", "Util", "Temp", "Power draw / limit",
                   "SM clock / max", "CC", "MIG", "UUID")
    PROCESS_HEADERS = ("GPU", "PID", "Process", "GPU memory")

    def __init__(self, snapshot: Snapshot, show_processes: bool = False) -> None:
        self.snapshot = snapshot
        self.show_processes = show_processes

    # -- the model every rendering shares ---------------------------------------------------

    def summary(self) -> list[tuple[str, str]]:
        """The report's label/value rows above the GPU table."""
        snap = self.snapshot
        host, platform, torch, xla = (snap.host, snap.platform, snap.software.torch,
                                      snap.software.xla)
        persistent = str(platform.persistent_dir) if platform.persistent_dir else "none"
        rows = [
            ("Platform", f"{platform.name} (container: {_value(platform.in_container)}; "
                         + (f"detected from {', '.join(platform.evidence)})" if platform.evidence
                            else "no cloud platform detected)")),
            ("Session limit", f"{format_duration(platform.session_limit_s)}; idle timeout "
                              f"{format_duration(platform.idle_timeout_s)}"),
            ("Persistent folder", persistent),
            ("Scratch folder", str(platform.scratch_dir)),
            ("CPU", f"{host.cpu_model or NA}: {_value(host.cpu_logical)} logical, "
                    f"{_value(host.cpu_physical)} physical, {_cores(host.cpu_usable)} usable"),
            ("RAM", f"{format_of(host.memory_free, host.memory_usable, 'free of')}"
                    f" (host {format_bytes(host.memory_total)}, container limit "
                    f"{format_bytes(host.memory_limit) if host.memory_limit else 'none'})"),
            ("Swap", format_of(host.swap_used, host.swap_total, "used of")
                     if host.swap_total else "none"),
        ]
        rows += [(f"Disk ({disk.role})", f"{disk.path}: " + (
            format_of(disk.free, disk.total, "free of")
            if disk.total is not None and disk.free is not None else "not present"))
            for disk in snap.disks]
        rows += [
            ("NVIDIA driver", f"{_value(snap.gpus.driver_version)} "
                              f"(CUDA {_value(snap.gpus.cuda_driver_version)})"),
            ("torch", "not installed" if torch.version is None else
             f"{torch.version}, CUDA runtime {_value(torch.cuda_runtime)}, cuDNN "
             f"{_value(torch.cudnn)}, CUDA available {_value(torch.cuda_available)}"),
            ("bf16 on GPU", _value(snap.bf16_supported)),
            ("XLA / TPU", f"torch_xla {xla.torch_xla_version or 'not installed'}, PJRT_DEVICE "
                          f"{xla.pjrt_device or 'unset'}, TPU {_value(xla.tpu_present)}"),
            ("Apple MPS", _value(torch.mps_available)),
            ("Python", f"{snap.software.python} on {snap.software.os}"),
        ]
        return rows

    def gpu_status(self) -> str:
        """One line on the GPUs: how many, hidden ones, or plainly why there are none."""
        gpus = self.snapshot.gpus
        hidden = f"{gpus.hidden} hidden by CUDA_VISIBLE_DEVICES" if gpus.hidden else ""
        if gpus.unavailable_reason is not None:
            return f"No NVIDIA GPU: {gpus.unavailable_reason}."
        if not gpus.devices:
            return f"No NVIDIA GPU visible: {hidden or 'the driver reports none'}."
        count = len(gpus.devices)
        return f"{count} NVIDIA GPU{'' if count == 1 else 's'} visible" + (
            f" ({hidden})." if hidden else ".")

    def gpu_table(self) -> Table:
        """Headers and one row per visible GPU."""
        rows = [
            (str(gpu.index), gpu.name or NA, _gpu_memory(gpu), _value(gpu.utilization_gpu, "%"),
             _value(gpu.temperature_c, " C"), _pair(gpu.power_draw_w, gpu.power_limit_w, " W"),
             _pair(gpu.clock_sm_mhz, gpu.clock_sm_max_mhz, " MHz"),
             gpu.compute_capability or NA, _mig(gpu), gpu.uuid or NA)
            for gpu in self.snapshot.gpus.devices
        ]
        return self.GPU_HEADERS, rows

    def process_table(self) -> Table:
        """Headers and one row per process holding GPU memory."""
        rows = []
        for gpu in self.snapshot.gpus.devices:
            if gpu.processes is None:
                rows.append((str(gpu.index), NA, "process list not supported by the driver", NA))
                continue
            rows += [(str(gpu.index), str(p.pid), p.name or NA, format_bytes(p.used_memory))
                     for p in gpu.processes]
        return self.PROCESS_HEADERS, rows

    def to_dict(self) -> dict[str, Any]:
        """The snapshot's full data, JSON-ready."""
        return self.snapshot.to_dict()

    def to_json(self) -> str:
        """The snapshot's full data as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    # -- renderings -------------------------------------------------------------------------

    def _tables(self) -> list[tuple[str, Table]]:
        tables = []
        if self.snapshot.gpus.devices:
            tables.append(("GPUs", self.gpu_table()))
            if self.show_processes:
                tables.append(("GPU processes", self.process_table()))
        return tables

    def __str__(self) -> str:
        lines = [*label_lines(self.summary()), "", self.gpu_status(),
                 *(f"Warning: {problem}" for problem in self.snapshot.build_problems)]
        for title, (headers, rows) in self._tables():
            lines += ["", title, *aligned_lines(headers, rows)]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        parts = [html_pairs(self.summary(), "ipycloud-report"),
                 f"<p><b>{html.escape(self.gpu_status())}</b></p>",
                 *(f"<p class='ipycloud-warning'><b>Warning:</b> {html.escape(problem)}</p>"
                   for problem in self.snapshot.build_problems)]
        for title, table in self._tables():
            parts.append(f"<h4>{html.escape(title)}</h4>{html_table(table)}")
        return "<div class='ipycloud'>" + "".join(parts) + "</div>"


class Reportable(Protocol):
    """Anything that can give its content as a JSON-able dict."""

    def to_dict(self) -> dict[str, Any]: ...


class JsonReport:
    """A report as JSON: a JSON tree in JupyterLab, indented text elsewhere."""

    def __init__(self, report: Reportable) -> None:
        self.data = report.to_dict()

    def __str__(self) -> str:
        return json.dumps(self.data, indent=2)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_json_(self) -> dict[str, Any]:
        return self.data


def _cores(value: float | None) -> str:
    if value is None:
        return NA
    return f"{value:g}"


def environment_report(processes: bool = False) -> EnvironmentReport:
    """Probe this machine now and return the report; ``processes`` lists GPU processes too."""
    return EnvironmentReport(take_snapshot(with_processes=processes), show_processes=processes)
