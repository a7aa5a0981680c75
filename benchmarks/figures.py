"""Summary figures shared by the benchmarks."""

from __future__ import annotations


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` from 0 to 1) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]
