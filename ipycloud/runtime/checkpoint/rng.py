"""Random number generator states: captured with a checkpoint, restored on resume.

Covers Python's ``random``, NumPy's global generator, torch on the CPU, every CUDA device
(only once this process has initialised CUDA: capturing must not initialise it), and XLA
when torch_xla is already in use. States are kept as tensors, lists and numbers, so they
load with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
import sys
from typing import Any


def capture_rng_states() -> dict[str, Any]:
    """The state of every random generator this process uses."""
    import torch

    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = _numpy_state(numpy)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    xla_model = _xla_model()
    if xla_model is not None:
        states["xla"] = xla_model.get_rng_state()
    return states


def restore_rng_states(states: dict[str, Any]) -> list[str]:
    """Put the captured states back; returns the names of the generators restored."""
    import torch

    restored = []
    if "python" in states:
        random.setstate(_as_tuples(states["python"]))
        restored.append("python")
    if "numpy" in states:
        import numpy

        kind, key, position, has_gauss, gauss = states["numpy"]
        numpy.random.set_state((kind, numpy.asarray(key, dtype=numpy.uint32), position,
                                has_gauss, gauss))
        restored.append("numpy")
    if "torch" in states:
        torch.set_rng_state(states["torch"])
        restored.append("torch")
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
        restored.append("cuda")
    xla_model = _xla_model()
    if "xla" in states and xla_model is not None:
        xla_model.set_rng_state(states["xla"])
        restored.append("xla")
    return restored


def _numpy_state(numpy: Any) -> tuple[Any, ...]:
    kind, key, position, has_gauss, gauss = numpy.random.get_state()
    return (kind, key.tolist(), int(position), int(has_gauss), float(gauss))


def _xla_model() -> Any:
    """torch_xla's xla_model module if the program already imported torch_xla, else None."""
    if "torch_xla" not in sys.modules:
        return None
    import torch_xla.core.xla_model as xla_model

    return xla_model


def _as_tuples(value: Any) -> Any:
    """random.setstate wants tuples all the way down; a round trip may give lists."""
    if isinstance(value, list | tuple):
        return tuple(_as_tuples(item) for item in value)
    return value
