"""Summary figures shared by the benchmarks."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` from 0 to 1) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def distribution(values: list[float]) -> dict[str, float]:
    """The minimum, median, 90th and 99th percentiles (nearest rank) and maximum of
    ``values``, each rounded to the millisecond (for seconds); {} for no values."""
    if not values:
        return {}
    return {name: round(percentile(values, share), 3) for name, share in (
        ("min", 0.0), ("median", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))}


def machine() -> dict[str, object]:
    """The machine a soak ran on, and how busy it was (the 1-minute load average)."""
    return {"cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load_average_1min": round(os.getloadavg()[0], 2)}


def write_soak(results: dict[str, Any], out: Path, began: float, load_before: float,
               folder: str) -> None:
    """Add the machine (its load at the start and the end), the ``folder`` worked in and
    the time since ``began`` (``time.monotonic()``) to ``results``; say them, and write
    ``results`` to ``out``."""
    results["machine"] = {**machine(), "load_average_1min_at_start": round(load_before, 2),
                          "folder": folder}
    results["total_s"] = round(time.monotonic() - began, 1)
    print(f"{results['total_s']} s in all; load average {load_before:.2f} at the start, "
          f"{results['machine']['load_average_1min']} at the end")
    write_results(out, results, indent=1)
    print(f"written to {out}")


def write_results(out: Path, results: Any, indent: int = 2) -> None:
    """Write ``results`` to ``out`` as JSON, making its folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=indent) + "\n")
