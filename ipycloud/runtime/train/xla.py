"""XLA (torch_xla) for the training loop: small wrappers, each naming the torch_xla call.

The loop imports nothing from torch_xla itself. On XLA, operations are traced lazily and run
when the step is cut: by :func:`device_loader` before each batch, by :func:`step_barrier`,
by :func:`to_cpu`, or by reading a value on the host (``.item()``, ``.cpu()``, ``print``).
Reading the loss every step therefore costs a sync each step: sum it on the device and
call ``.item()`` once per progress interval.

Precision on XLA is bfloat16 (``torch.autocast("xla", dtype=torch.bfloat16)``) or float32.
There is no float16 + GradScaler path: TPUs compute in bfloat16, which needs no scaling.

The XLA random generator's state is one integer (``xm.get_rng_state()``), saved with the
other generators by ``ipycloud.runtime.checkpoint.rng``. Every cut advances it by a fixed
map, however many draws the step made, and draws still pending are not in it: capture it
after a cut (:func:`to_cpu` makes one), and resume with the same cuts to get the same draws.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ipycloud.runtime._optional import is_available, require

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch


def xla_available() -> bool:
    """Whether torch_xla is installed, found without importing it (importing claims a TPU)."""
    return is_available("torch_xla")


def xla_device() -> torch.device:
    """This process's XLA device, e.g. ``xla:0``: ``torch_xla.device()``.

    ``PJRT_DEVICE`` (TPU, CUDA, CPU) picks the hardware. Raises ImportError naming the
    ``ipycloud[xla]`` extra when torch_xla is not installed.
    """
    torch_xla = require("torch_xla", "xla")
    return torch_xla.device()


def is_xla_device(device: torch.device | str) -> bool:
    """Whether ``device`` (a torch.device or a string such as ``"xla:0"``) is an XLA device."""
    import torch

    return torch.device(device).type == "xla"


def device_loader(loader: Iterable[Any], device: torch.device) -> Iterable[Any]:
    """Batches of ``loader`` moved to ``device`` ahead of use by background threads:
    ``torch_xla.distributed.parallel_loader.ParallelLoader``, as ``MpDeviceLoader`` does.

    Each ``next()`` first cuts the step (``torch_xla.sync()``), so a loop fed by it needs no
    :func:`step_barrier` of its own. Unlike ``MpDeviceLoader``, an error raised by
    ``loader`` is raised here, after the batches before it (torch_xla only prints it from
    its thread and ends the pass early), and a pass left early stops its threads.
    Each iteration is a new pass over ``loader``; ``len()`` is ``len(loader)``.
    """
    require("torch_xla", "xla")
    return _DeviceBatches(loader, device)


class _DeviceBatches:
    """The iterable :func:`device_loader` returns."""

    def __init__(self, loader: Iterable[Any], device: torch.device) -> None:
        self._loader = loader
        self._device = device

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        from torch_xla.distributed.parallel_loader import ParallelLoader

        source = _ErrorKeeping(self._loader)
        parallel = ParallelLoader(source, [self._device])
        try:
            yield from parallel.per_device_loader(self._device)
        finally:
            parallel.close()  # joins the threads; at once when the pass ran to its end
        if source.error is not None:
            raise source.error


class _ErrorKeeping:
    """Iterates ``loader`` in torch_xla's thread, keeping the error that ends it."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self._loader = loader
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._loader
        except Exception as error:
            self.error = error


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: Any = None) -> None:
    """``optimizer.step()`` after averaging gradients over replicas: ``xm.optimizer_step``.

    It does not cut the step (``barrier=False``): :func:`device_loader` or
    :func:`step_barrier` does. ``scaler`` must be None: a GradScaler belongs to float16,
    and precision on XLA is bfloat16 or float32.
    """
    if scaler is not None:
        raise ValueError("XLA trains in bfloat16 or float32: a GradScaler (float16) has no use")
    require("torch_xla", "xla")
    import torch_xla.core.xla_model as xm

    xm.optimizer_step(optimizer)


def step_barrier() -> None:
    """Cut the traced graph and launch it: ``torch_xla.sync()`` (formerly ``xm.mark_step``)."""
    require("torch_xla", "xla").sync()


def autocast(dtype: torch.dtype) -> AbstractContextManager[Any]:
    """Mixed precision for a forward pass on XLA: ``torch.autocast("xla", dtype=bfloat16)``.

    ``torch.float32`` gives a context that changes nothing. Any other dtype raises ValueError
    (``torch.autocast("xla")`` would warn and disable itself, or on XLA:CPU run float16).
    """
    import torch

    if dtype == torch.float32:
        return contextlib.nullcontext()
    if dtype != torch.bfloat16:
        raise ValueError(f"XLA trains in bfloat16 or float32, not {dtype}")
    return torch.autocast("xla", dtype=torch.bfloat16)


def to_cpu(tree: Any) -> Any:
    """``tree`` (nested dicts, lists, tuples) with every XLA tensor copied to the CPU.

    For checkpoints: ``torch.save`` keeps XLA tensors on XLA, so loading them would need
    torch_xla. Pending work is run first (``torch_xla.sync(wait=True)``, which cuts the
    step) so each copy is a plain transfer. Other leaves are returned as they are;
    containers come back as plain dict, list and tuple.
    """
    if _has_xla_tensor(tree):
        pass
    return _map_xla_tensors(tree)


def _has_xla_tensor(tree: Any) -> bool:
    if isinstance(tree, dict):
        return any(_has_xla_tensor(value) for value in tree.values())
    if isinstance(tree, list | tuple):
        return any(_has_xla_tensor(value) for value in tree)
    return _is_xla_tensor(tree)


def _map_xla_tensors(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _map_xla_tensors(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_map_xla_tensors(value) for value in tree]
    if isinstance(tree, tuple):
        return tuple(_map_xla_tensors(value) for value in tree)
    return tree.cpu() if _is_xla_tensor(tree) else tree


def _is_xla_tensor(value: Any) -> bool:
    device = getattr(value, "device", None)
    return getattr(device, "type", None) == "xla"
