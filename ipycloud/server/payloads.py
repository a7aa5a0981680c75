"""The JSON bodies of the routes, built from the runtime's readings (README.md gives their
shapes). Sizes are bytes, times Unix seconds, percentages 0-100; a figure the machine cannot
give is None (null), never left out."""

from __future__ import annotations

from typing import Any

from ipycloud.runtime.machine.nvml import GpuDetail
from ipycloud.runtime.monitor.deaths import Death, signal_name
from ipycloud.runtime.monitor.host import HostSample
from ipycloud.runtime.monitor.processes import ProcessTree
from ipycloud.runtime.monitor.samples import GpuSample
from ipycloud.runtime.units import format_bytes

Json = dict[str, Any]


def reading(sample: HostSample, interval: float) -> Json:
    """The body of ``reading``, and each entry of ``history``."""
    details = {detail.cuda_index: detail for detail in sample.gpu_details}
    return {
        "time": sample.time,
        "interval_s": interval,
        "platform": {"name": sample.platform, "session_left_s": sample.session_left_s},
        "gpu_problem": sample.gpu_problem,
        "gpus": [_gpu(gpu, details.get(gpu.index)) for gpu in sample.gpus],
        "cpu": {"percent": sample.cpu_percent, "cores": sample.cpu_cores,
                "throttled_percent": sample.cpu_throttled_percent},
        "ram": {"used": sample.ram_used, "limit": sample.ram_limit,
                "limited": sample.ram_limited, "peak": sample.ram_peak,
                "swap_used": sample.swap_used, "swap_total": sample.swap_total},
        "disks": [{"name": disk.role, "path": disk.path, "used": disk.used, "total": disk.total}
                  for disk in sample.disks],
    }


def _gpu(gpu: GpuSample, detail: GpuDetail | None) -> Json:
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": None if detail is None else detail.uuid,
        "utilization_percent": _float(gpu.utilization),
        "memory_used": gpu.memory_used,
        "memory_total": gpu.memory_total,
        "temperature_c": _float(gpu.temperature),
        "power_w": gpu.power_draw_w,
        "power_limit_w": gpu.power_limit_w,
        "mig": [] if detail is None else [
            {"uuid": mig.uuid, "memory_used": mig.memory_used, "memory_total": mig.memory_total}
            for mig in detail.mig],
    }


def kernel(kernel_id: str, name: str | None, execution_state: str | None,
           session: Json | None, pid: int | None, problem: str | None,
           tree: ProcessTree | None) -> Json:
    """One entry of ``kernels``: ``session`` is the session manager's model of the kernel's
    session, ``tree`` its process tree at the latest reading (None before one saw it)."""
    alive = tree if tree is not None and tree.alive else None
    return {
        "id": kernel_id,
        "name": name,
        "path": None if session is None else session.get("path"),
        "type": None if session is None else session.get("type"),
        "execution_state": execution_state,
        "pid": pid,
        "problem": problem,
        "processes": None if alive is None else len(alive.pids),
        "rss": None if alive is None else alive.rss,
        "cpu_percent": None if alive is None else alive.cpu_percent,
        "gpu_memory": [{"gpu": share.gpu, "used": share.used}
                       for share in (alive.gpu_memory if alive is not None else ())],
    }


def death_message(who: str, death: Death, returncode: int | None) -> str:
    """The event's line: ``the kernel of train.ipynb was killed: out of memory (limit 12.7
    GiB, peak 12.6 GiB)``; ``who`` names the kernel (``the kernel of train.ipynb``)."""
    if death.out_of_memory:
        figures = [f"{label} {format_bytes(value)}" for label, value in
                   (("limit", death.ram_limit), ("peak", death.ram_peak)) if value is not None]
        return f"{who} was killed: out of memory" + (f" ({', '.join(figures)})" if figures
                                                     else "")
    if returncode is None:
        return f"{who} died"
    if returncode < 0:
        name = signal_name(-returncode)
        return f"{who} was killed by signal {-returncode}" + (f" ({name})" if name else "")
    return f"{who} exited with code {returncode}"


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)
