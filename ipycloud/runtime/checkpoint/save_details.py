"""What a save records beside the state, checked before anything is written: the step,
the metrics, the data position, the versions of the libraries."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any, TypedDict

from ipycloud._version import __version__
from ipycloud.runtime.checkpoint import catalog
from ipycloud.runtime.units import as_float, finite_number
from ipycloud.runtime.untrusted import MAX_INT, is_count


class SaveDetails(TypedDict, total=False):
    """The keyword arguments of ``CheckpointManager.save`` other than ``blocking``."""

    epoch: int | None
    data_position: Any
    metrics: Mapping[str, float] | None
    tag: str | None
    rng_states: Mapping[str, Any] | None


def check_keep_last(keep_last: int | None) -> None:
    """ValueError unless ``keep_last`` is a positive integer or None (keep all)."""
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                  or keep_last < 1):
        raise ValueError(f"keep_last must be a positive integer or None, not {keep_last!r}")


def check_step(step: int) -> None:
    """ValueError unless ``step`` is an integer a checkpoint's name can hold."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, not {step!r}")
    if step > catalog.MAX_STEP:
        raise ValueError(f"step must be at most {catalog.MAX_STEP} (checkpoint names hold "
                         f"nine digits), not {step}")


def check_epoch(epoch: int | None) -> None:
    """ValueError unless ``epoch`` is None or a count a manifest keeps exactly."""
    if epoch is not None and not is_count(epoch):
        raise ValueError(f"epoch must be a non-negative integer (at most 2**53) or None, "
                         f"not {epoch!r}")


def finite_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """Metrics as plain floats (tensors and NumPy scalars included), less those that are
    NaN or infinite: they rank nothing, and a manifest is strict JSON."""
    values = {}
    for key, value in (metrics or {}).items():
        try:
            number = as_float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {key!r} must be a number, not {value!r}") from None
        if finite_number(number):
            values[str(key)] = number
    return values


def json_ready(value: Any, name: str) -> Any:
    """``value``, or ValueError naming it (``name``) where it is not strict JSON data that
    reads back as written (an integer beyond 2**53 would read back as null)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        exact = False
    else:
        exact = _exact(value)
    if not exact:
        raise ValueError(f"{name} must be JSON data (finite numbers, integers within "
                         f"2**53, strings, lists, dicts), not {value!r}")
    return value


def _exact(value: Any) -> bool:
    """Whether every integer in ``value`` is one a reader of manifests keeps exactly."""
    if isinstance(value, int) and not isinstance(value, bool):
        return -MAX_INT <= value <= MAX_INT
    if isinstance(value, dict):
        return all(map(_exact, value.values()))
    if isinstance(value, list | tuple):
        return all(map(_exact, value))
    return True


def versions() -> dict[str, str | None]:
    """The versions of Python, ipycloud and the loaded libraries a checkpoint depends on."""
    found: dict[str, str | None] = {"python": sys.version.split()[0], "ipycloud": __version__}
    for module in ("torch", "numpy", "torch_xla"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            found[module] = getattr(loaded, "__version__", None)
    torch = sys.modules.get("torch")
    if torch is not None:
        found["cuda"] = torch.version.cuda
    return found
