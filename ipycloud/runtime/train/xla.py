"""XLA (torch_xla) for the training loop: small wrappers, each naming the torch_xla call.

The loop imports nothing from torch_xla itself. On XLA, operations are traced lazily and run
when the step is cut (``torch_xla.sync()``): by :func:`device_loader` between batches or by
:func:`to_cpu`. Reading a value on the host (``.item()``,
``.cpu()``, ``print``) runs the graph that value needs at once and waits for it: sum the loss
on the device and read it once per progress interval, not every step.

Precision on XLA is bfloat16 (``torch.autocast("xla", dtype=torch.bfloat16)``) or float32.
There is no float16 + GradScaler path: TPUs compute in bfloat16, which needs no scaling.

The XLA random generator's state is one integer (``xm.get_rng_state()``), saved with the
other generators by ``ipycloud.runtime.checkpoint.rng``. Every cut advances it by a fixed map,
however many draws the step made, and draws still pending are not in it. So the cuts made here
follow one rule: one cut between two batches of a pass, made by whichever of the device loader
and :func:`to_cpu` comes first; one more at the end of a pass; none before its first batch.
A checkpoint (:func:`to_cpu`, then the RNG states) then neither changes the run's draws nor
captures a pending state, and a run resumed from it draws what the uninterrupted run draws.
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


def device_loader(loader: Iterable[Any], device: torch.device) -> Iterable[Any]:
    """Batches of ``loader`` moved to ``device`` ahead of use by background threads:
    ``torch_xla.distributed.parallel_loader.ParallelLoader``, as ``MpDeviceLoader`` does.

    Before each batch after the first it cuts the step (``torch_xla.sync()``) unless
    :func:`to_cpu` already did, and it cuts at the end of the pass: a
    loop fed by it needs no cut of its own. Unlike ``MpDeviceLoader``, an error raised by
    ``loader`` is raised here, after the batches before it (torch_xla only prints it from
    its thread and ends the pass early), and a pass left early stops its threads.
    Each iteration is a new pass over ``loader``; ``len()`` is ``len(loader)``.
    """
    require("torch_xla", "xla")
    return _DeviceBatches(loader, device)


class _Cuts:
    """Whether a batch went out since the last cut: one process has one XLA device state."""

    pending = False


class _DeviceBatches:
    """The iterable :func:`device_loader` returns."""

    def __init__(self, loader: Iterable[Any], device: torch.device) -> None:
        self._loader = loader
        self._device = device

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        from torch_xla.debug import profiler
        from torch_xla.distributed.parallel_loader import ParallelLoader

        source = _ErrorKeeping(self._loader)
        parallel = ParallelLoader(source, [self._device])
        batches = parallel.per_device_loader(self._device)
        first = True
        try:
            while True:
                # The loader cuts before every batch unless this flag says the step is cut.
                profiler.set_tracer_marked_step(first or not _Cuts.pending)
                first = False
                try:
                    batch = next(batches)
                except StopIteration:  # after the loader's unconditional end-of-pass cut
                    _Cuts.pending = False
                    break
                _Cuts.pending = True
                yield batch
        finally:
            profiler.set_tracer_marked_step(False)  # unused if an interrupt came before next()
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


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()`` after averaging gradients over replicas: ``xm.optimizer_step``.

    It does not cut the step (``barrier=False``): :func:`device_loader` does.
    """
    require("torch_xla", "xla")
    import torch_xla.core.xla_model as xm

    xm.optimizer_step(optimizer)


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
    """``tree`` (nested mappings, lists, tuples) with every tensor replaced by a CPU copy.

    For checkpoints: ``torch.save`` keeps XLA tensors on XLA, so loading them would need
    torch_xla, and a tensor already on the CPU (an optimizer's step count) is copied too,
    since training goes on changing it. When a batch went out since the last cut, the step
    is cut (``torch_xla.sync(wait=True)``) before the first XLA tensor is copied, in place
    of the device loader's next cut, so the copies are plain transfers. Other leaves are
    returned as they are; containers as ``map_tensors`` rebuilds them.
    """
    from ipycloud.runtime.checkpoint.state import map_tensors

    def copy(tensor: Any, _path: tuple[Any, ...]) -> Any:
        if _Cuts.pending and tensor.device.type == "xla":
            require("torch_xla", "xla").sync(wait=True)
            _Cuts.pending = False
        return tensor.detach().to("cpu", copy=True)

    return map_tensors(tree, copy)


class OnCpu:
    """A live object whose state_dict is moved to the CPU: XLA tensors cannot be saved."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def state_dict(self) -> Any:
        return to_cpu(self._obj.state_dict())

    def load_state_dict(self, state: Any) -> Any:
        return self._obj.load_state_dict(state)
