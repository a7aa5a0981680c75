"""Turning live objects into saveable state, and host copies of it for background writes.

A state maps names to live objects: anything with ``state_dict()`` / ``load_state_dict()``
(modules, optimizers, LR schedulers, GradScaler), tensors (restored in place), torch
Generators, and plain values (numbers, strings, lists, dicts), which are put back into the
mapping on restore (``restore.py``). Every leaf must be something
``torch.load(weights_only=True)`` accepts, and this is checked before anything is written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ipycloud.runtime.checkpoint.errors import CheckpointError

STATEFUL, TENSOR, GENERATOR, VALUE = "stateful", "tensor", "generator", "value"
_PLAIN = (int, float, bool, str, bytes, complex, type(None))

Shapes = list[list[list[int]]]  # per parameter group, the shape of each parameter


class Captured(NamedTuple):
    """A state in saveable form, with what restoring it needs to check first."""

    saved: dict[str, Any]  # name -> state_dict(), tensor, generator state or value
    kinds: dict[str, str]  # name -> how it was captured
    shapes: dict[str, Shapes]  # optimizer name -> its parameters' shapes


def kind_of(obj: Any) -> str | None:
    """How an object is saved, or None when it cannot be."""
    import torch

    if callable(getattr(obj, "state_dict", None)) and callable(
            getattr(obj, "load_state_dict", None)):
        return STATEFUL
    if isinstance(obj, torch.Tensor):
        return TENSOR
    if isinstance(obj, torch.Generator):
        return GENERATOR
    if isinstance(obj, (*_PLAIN, list, tuple, dict)):
        return VALUE
    return None


def capture(state: Mapping[str, Any]) -> Captured:
    """The saveable form of each named object, how each was captured, optimizers' shapes."""
    import torch

    captured = Captured({}, {}, {})
    for name, obj in state.items():
        kind = kind_of(obj)
        if kind is None:
            raise CheckpointError(
                f"state[{name!r}] is a {type(obj).__name__}, which has no state_dict(): save "
                "modules, optimizers, schedulers, scalers, tensors, generators or plain values"
                + _numpy_hint(obj))
        value = (obj.state_dict() if kind == STATEFUL else obj.detach() if kind == TENSOR
                 else obj.get_state() if kind == GENERATOR else obj)
        check_loadable(value, f"state[{name!r}]")
        captured.saved[name], captured.kinds[name] = value, kind
        if isinstance(obj, torch.optim.Optimizer):
            captured.shapes[name] = parameter_shapes(obj)
    return captured


def parameter_shapes(optimizer: Any) -> Shapes:
    """The shape of every parameter an optimizer holds, group by group."""
    return [[list(parameter.shape) for parameter in group["params"]]
            for group in optimizer.param_groups]


def check_loadable(value: Any, where: str) -> None:
    """Raise CheckpointError naming the first leaf that safe loading would refuse."""
    import torch

    # Exact types for plain values and containers: subclasses (NumPy scalars are floats,
    # enums are ints, namedtuples are tuples) pickle by class name, which a safe load refuses.
    if type(value) in _PLAIN or isinstance(value, (torch.Tensor, torch.dtype, torch.device,
                                                   torch.Size)):
        return
    if type(value) in (dict, OrderedDict):
        for key, item in value.items():
            check_loadable(key, f"{where} key {key!r}")
            check_loadable(item, f"{where}[{key!r}]")
        return
    if type(value) in (list, tuple, set):
        for index, item in enumerate(value):
            check_loadable(item, f"{where}[{index}]")
        return
    raise CheckpointError(f"{where} is a {type(value).__name__}, which a safe "
                          f"(weights_only) load cannot read back{_numpy_hint(value)}")


def _numpy_hint(value: Any) -> str:
    if type(value).__module__ != "numpy":
        return ""
    return " (convert it with torch.from_numpy, or .item() for a scalar)"


class HostBuffers:
    """Host copies of a state's tensors, reused from one asynchronous save to the next.

    A tensor keeps its buffer while its place in the state, shape and dtype stay the same,
    so steady-state saves allocate nothing. Buffers for CUDA tensors are pinned, which lets
    the device-to-host copies run asynchronously.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], Any] = {}

    def copy(self, value: Any) -> Any:
        """A copy of ``value`` whose tensors live in this object's host buffers."""
        import torch

        copied = map_tensors(value, self._copy_tensor)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non-blocking copies must land before writing
        return copied

    def _copy_tensor(self, tensor: Any, path: tuple[Any, ...]) -> Any:
        import torch

        tensor = tensor.detach()
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                                 pin_memory=tensor.is_cuda)
            self._buffers[path] = buffer
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        return buffer


def map_tensors(tree: Any, fn: Callable[[Any, tuple[Any, ...]], Any],
                path: tuple[Any, ...] = ()) -> Any:
    """``tree`` with every tensor replaced by ``fn(tensor, path)``.

    ``path`` is the keys and indexes that lead from the root to the tensor. Mappings come
    back as dicts (an OrderedDict as an OrderedDict), lists and tuples as their own type,
    namedtuples included; other leaves as they are.
    """
    import torch

    if isinstance(tree, torch.Tensor):
        return fn(tree, path)
    if isinstance(tree, Mapping):
        mapped = {key: map_tensors(value, fn, (*path, key)) for key, value in tree.items()}
        return OrderedDict(mapped) if isinstance(tree, OrderedDict) else mapped
    if isinstance(tree, list | tuple):
        if all(type(item) in _PLAIN for item in tree):  # random generator states: fast
            items = list(tree)
        else:
            items = [map_tensors(item, fn, (*path, index)) for index, item in enumerate(tree)]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree
