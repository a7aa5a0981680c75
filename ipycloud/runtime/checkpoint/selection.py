"""Which checkpoints "latest", "best", a step or a tag picks, preferred first, and the
rule "best" ranks them by."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ipycloud.runtime.checkpoint import catalog
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.checkpoint.errors import CheckpointError
from ipycloud.runtime.messages import worded
from ipycloud.runtime.units import finite_number

Which = str | int
KeepBest = tuple[str, str, int]  # (metric, "min" or "max", how many to keep)


def keep_best_rule(keep_best: tuple[Any, ...]) -> KeepBest:
    """``(metric, mode, count)`` from ``(metric, mode[, count])``; ValueError otherwise."""
    parts = (*keep_best, 1) if isinstance(keep_best, tuple) and len(keep_best) == 2 else keep_best
    metric, mode, count = parts if isinstance(parts, tuple) and len(parts) == 3 else (None,) * 3
    if not isinstance(metric, str) or mode not in ("min", "max") or not (
            isinstance(count, int) and not isinstance(count, bool) and count >= 1):
        raise ValueError("keep_best is (metric, 'min' or 'max'[, count >= 1]), "
                         f"not {keep_best!r}")
    return metric, mode, count


def preferred(infos: Sequence[CheckpointInfo], which: Which, directory: Path,
              keep_best: KeepBest | None,
              best_by: tuple[str, str] | None = None) -> Sequence[CheckpointInfo]:
    """The checkpoints of ``infos`` (oldest first) matching ``which``, preferred first: for
    "best" the best by ``best_by``, else by ``keep_best``, else by the rule the newest was
    saved with; otherwise the newest. CheckpointError when none matches a step, a tag or
    "best"; none for "latest" is an empty list."""
    if which == catalog.BEST:
        metric, mode, _ = (best_rule(keep_best, infos, directory) if best_by is None
                           else keep_best_rule(best_by))
        candidates = ranked(infos, metric, mode)
        if not candidates:
            saved = ", ".join(sorted({key for info in infos for key in info.metrics}))
            raise CheckpointError(f"no checkpoint in {directory} has the metric "
                                  f"{metric!r} that 'best' is ranked by (metrics saved: "
                                  f"{saved or 'none'})")
    else:
        candidates = _matching(infos, which)
    if not candidates and which != "latest":
        raise CheckpointError(_not_found(which, infos, directory))
    return candidates


def best_rule(keep_best: KeepBest | None, infos: Sequence[CheckpointInfo],
              directory: Path) -> KeepBest:
    """``keep_best``, else the rule the newest checkpoint of ``infos`` was saved with."""
    if keep_best is not None:
        return keep_best
    recorded = next((info.keep_best for info in reversed(infos) if info.keep_best), None)
    saved = ", ".join(sorted({key for info in infos for key in info.metrics}))
    if recorded is None and not saved:
        raise worded(CheckpointError, "{best} ranks checkpoints by a metric, and no "
                     "checkpoint in {folder} has one: restore the latest, a step or a tag",
                     best="which='best'", folder=str(directory))
    if recorded is None:
        raise worded(CheckpointError, "{best} needs the metric to rank by: pass "
                     "{best_by}, as no checkpoint in {folder} was saved with a keep_best "
                     "rule (metrics saved: {saved})", best="which='best'",
                     best_by="best_by=(metric, 'min' or 'max')", folder=str(directory),
                     saved=saved)
    return keep_best_rule(tuple(recorded))


def ranked(infos: Sequence[CheckpointInfo], metric: str, mode: str) -> list[CheckpointInfo]:
    """The checkpoints that recorded ``metric`` as a finite number, best first; of equals,
    the first to reach the value (as early stopping counts: only a strict improvement is
    one)."""
    scored = [info for info in infos if finite_number(info.metrics.get(metric))]
    return sorted(scored, key=lambda info: (info.metrics[metric] * (1 if mode == "min" else -1),
                                            info.sequence))


def _matching(infos: Sequence[CheckpointInfo], which: Which) -> list[CheckpointInfo]:
    newest_first = list(reversed(infos))
    if which == "latest":  # the newest complete one, whatever the pointer says
        return newest_first
    if isinstance(which, int) and not isinstance(which, bool):
        return [info for info in newest_first if info.step == which]
    if isinstance(which, str):
        return [info for info in newest_first if which in (info.tag, info.name)]
    raise TypeError(f"which must be 'latest', a step or a tag, not {which!r}")


def _not_found(which: Which, infos: Sequence[CheckpointInfo], directory: Path) -> str:
    if isinstance(which, int):
        steps = ", ".join(str(info.step) for info in infos) or "none"
        return f"no checkpoint of step {which} in {directory} (steps saved: {steps})"
    tags = ", ".join(sorted({info.tag for info in infos if info.tag})) or "none"
    return f"no checkpoint tagged or named {which!r} in {directory} (tags: {tags})"
