"""The JSON bodies of a monitor's ``reading`` and ``history`` routes, built from the sampler's
readings; the Jupyter server extension and the kernel's dashboard page both answer them
(ipycloud/server/schema/ gives their shapes).

Sizes are bytes, times Unix seconds, percentages 0-100; a figure the machine cannot give is
None (null), never left out. A plain Sample (the kernel's own sampler) has none of the
figures a HostSample (the Jupyter server's) adds: they read null (session time, cores,
throttling, RAM peak, the server's and its kernels' memory, GPU UUIDs, network, disk I/O)
or empty (MIG instances).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from ipycloud.runtime.machine.nvml import GpuDetail
from ipycloud.runtime.monitor.host import HostSample
from ipycloud.runtime.monitor.samples import GpuSample, Sample

Json = dict[str, Any]

_SAMPLE_FIELDS = tuple(field.name for field in fields(Sample))


def reading(sample: Sample, interval: float) -> Json:
    """The body of ``reading``, and each entry of ``history``; ``interval`` is the seconds
    between the readings the route's sampler takes."""
    served = isinstance(sample, HostSample)  # read by the Jupyter server, in its process
    host = sample if isinstance(sample, HostSample) else _as_host(sample)
    details = {detail.cuda_index: detail for detail in host.gpu_details}
    return {
        "time": host.time,
        "interval_s": interval,
        "platform": {"name": host.platform, "session_left_s": host.session_left_s},
        "gpu_problem": host.gpu_problem,
        "gpus": [_gpu(gpu, details.get(gpu.index)) for gpu in host.gpus],
        "cpu": {"percent": host.cpu_percent, "cores": host.cpu_cores,
                "throttled_percent": host.cpu_throttled_percent},
        "ram": {"used": host.ram_used, "limit": host.ram_limit,
                "limited": host.ram_limited, "peak": host.ram_peak,
                "swap_used": host.swap_used, "swap_total": host.swap_total,
                "server_rss": host.process_rss if served else None,
                "kernels_rss": _kernels_rss(host) if served else None},
        "disks": [{"name": disk.name, "roles": list(disk.roles), "paths": list(disk.paths),
                   "used": disk.used, "available": disk.available, "total": disk.total}
                  for disk in host.disks],
        "network": {"received_per_s": host.net_received_per_s,
                    "sent_per_s": host.net_sent_per_s},
        "disk_io": {"read_per_s": host.disk_read_per_s,
                    "written_per_s": host.disk_written_per_s},
    }


def history(samples: Iterable[Sample], interval: float) -> str:
    """The body of ``history`` as JSON text: ``{"interval_s": ..., "samples": [...]}``.

    Each reading is encoded on its own, so an hour of them never holds the interpreter's
    lock through one long ``json.dumps`` call: other threads (a training loop) run between.
    """
    return history_of_encoded((json.dumps(reading(sample, interval)) for sample in samples),
                              interval)


def history_of_encoded(readings: Iterable[str], interval: float) -> str:
    """The body of ``history`` from readings already encoded as JSON text, oldest first."""
    return f'{{"interval_s": {json.dumps(interval)}, "samples": [{",".join(readings)}]}}'


def parse_since(text: str | None) -> float | None:
    """The ``since`` parameter of ``history`` as a Unix time; None when absent.

    ValueError with the API's one-line message when it is not a finite number.
    """
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"since must be a finite number (a Unix time in seconds), "
                         f"not {text!r}")
    return value


def _as_host(sample: Sample) -> HostSample:
    """A plain Sample as a HostSample whose added figures are unknown."""
    return HostSample(**{name: getattr(sample, name) for name in _SAMPLE_FIELDS})


def _kernels_rss(host: HostSample) -> int:
    """The resident memory of the process trees of the kernels the server watches."""
    return sum(tree.rss for tree in host.watched.values()
               if tree.alive and tree.rss is not None)


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


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)
