"""Putting saved state back into live objects: every object checked before any is written.

A mismatch found by the checks (a module of other shapes, an optimizer with other
parameter groups or parameter shapes, a GradScaler state saved while it was disabled, a
tensor where a module was saved, a plain value that cannot go back into a read-only
mapping, an object's state for a name that has no live object yet) raises one
CheckpointError and changes nothing. A name given as ``UNDEFINED`` (a variable not defined
yet) gets its plain value; state that goes into a live object needs that object. Stateful
objects of other types (LR schedulers among them) cannot be checked beforehand: they are
restored first, so their failure, too, leaves the checked objects untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, cast

from ipycloud.runtime.checkpoint.errors import CheckpointError, CheckpointMismatchError
from ipycloud.runtime.checkpoint.state import (
    GENERATOR,
    STATEFUL,
    TENSOR,
    VALUE,
    Shapes,
    kind_of,
    parameter_shapes,
)
from ipycloud.runtime.messages import one_line
from ipycloud.runtime.units import counted

UNDEFINED: Any = object()  # a name's value in a state whose caller has no object for it yet

_WORDS = {STATEFUL: "an object's state_dict()", TENSOR: "a tensor",
          GENERATOR: "a generator state", VALUE: "a plain value"}


def restore(state: MutableMapping[str, Any] | Mapping[str, Any], saved: Mapping[str, Any],
            strict: bool, kinds: Mapping[str, str] | None = None,
            shapes: Mapping[str, Shapes] | None = None) -> list[str]:
    """Load saved values into the live objects of ``state``; returns the names restored.

    ``kinds`` says how each saved object was captured and ``shapes`` the parameter shapes
    of each saved optimizer (both as the checkpoint recorded them; checks that need them
    are skipped without).
    """
    missing = [name for name in state if name not in saved]
    if missing and strict:
        raise CheckpointMismatchError(
            f"the checkpoint has no {', '.join(map(repr, missing))} (it holds "
            f"{', '.join(map(repr, saved)) or 'nothing'})",
            "; pass strict=False to restore the rest")
    names = [name for name in state if name in saved]
    for name in names:
        problem = _problem(state, name, saved[name], strict, (kinds or {}).get(name),
                           (shapes or {}).get(name))
        if problem is not None:
            raise CheckpointMismatchError(f"cannot restore {name!r}: {problem}",
                                          _hint(state[name], saved[name], strict))
    names.sort(key=lambda name: _checked(state[name]))  # the unchecked ones first
    for name in names:
        _put_back(state, name, saved[name], strict)
    return names


def _checked(obj: Any) -> bool:
    """Whether ``_problem`` can tell beforehand that restoring ``obj`` will succeed."""
    import torch

    return kind_of(obj) != STATEFUL or isinstance(
        obj, torch.nn.Module | torch.optim.Optimizer | torch.amp.GradScaler)


def _problem(state: Mapping[str, Any], name: str, value: Any, strict: bool,
             saved_kind: str | None, shapes: Shapes | None) -> str | None:
    """Why the saved ``value`` cannot go into ``state[name]``, or None when it can."""
    import torch

    obj = state[name]
    if obj is UNDEFINED and saved_kind not in (None, VALUE):
        return (f"the checkpoint holds {_WORDS.get(saved_kind, saved_kind)}, which goes into a "
                f"live object: create {name} first, then restore")
    kind = kind_of(obj)
    if kind is None or kind == VALUE:  # replaced by the saved value
        return None if isinstance(state, MutableMapping) else (
            "a plain value cannot be put back into a read-only mapping: pass a dict")
    if saved_kind is not None and saved_kind != kind:
        return (f"the checkpoint holds {_WORDS.get(saved_kind, saved_kind)}, the live object "
                f"is {_WORDS.get(kind, kind)}")
    if kind == TENSOR:
        return _tensor_problem(obj, value)
    if kind == GENERATOR:
        return None if isinstance(value, torch.Tensor) and value.shape == obj.get_state().shape \
            else "the checkpoint holds no state of a generator of this kind"
    if isinstance(obj, torch.nn.Module):
        return _module_problem(obj, value, strict)
    if isinstance(obj, torch.optim.Optimizer):
        return _optimizer_problem(obj, value, shapes)
    if isinstance(obj, torch.amp.GradScaler):
        return _scaler_problem(obj, value)
    return None


def _tensor_problem(tensor: Any, value: Any) -> str | None:
    import torch

    if isinstance(value, torch.Tensor) and value.shape == tensor.shape:
        return None
    held = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
    return f"the checkpoint holds {held}, the live tensor is {tuple(tensor.shape)}"


def _module_problem(module: Any, value: Any, strict: bool) -> str | None:
    if not isinstance(value, Mapping):
        return "the checkpoint holds no module state"
    live = module.state_dict()
    wrong = _wrong_shapes(live, value)
    missing, unexpected = sorted(set(live) - set(value)), sorted(set(value) - set(live))
    problems = [f"shapes differ for {', '.join(wrong)}"] if wrong else []
    if strict and missing:
        problems.append(f"missing {', '.join(missing)}")
    if strict and unexpected:
        problems.append(f"unexpected {', '.join(unexpected)}")
    return "; ".join(problems) or None


def _hint(obj: Any, value: Any, strict: bool) -> str | None:
    """How ``strict=False`` would help a module whose keys differ but whose shapes fit."""
    import torch

    if (not strict or not isinstance(obj, torch.nn.Module) or not isinstance(value, Mapping)
            or _wrong_shapes(obj.state_dict(), value)):
        return None
    return " (strict=False skips missing and unexpected keys)"


def _wrong_shapes(live: Mapping[str, Any], saved: Mapping[str, Any]) -> list[str]:
    """The keys of a module's state whose saved tensor has another shape than the live one."""
    return [key for key, tensor in saved.items()
            if key in live and getattr(tensor, "shape", None) != live[key].shape]


def _optimizer_problem(optimizer: Any, value: Any, shapes: Shapes | None) -> str | None:
    """The checks of ``Optimizer.load_state_dict``, made before it runs, and the shapes."""
    groups = value.get("param_groups") if isinstance(value, Mapping) else None
    if (not isinstance(groups, list) or "state" not in value
            or not all(isinstance(group, Mapping) and "params" in group for group in groups)):
        return "the checkpoint holds no optimizer state"
    live = optimizer.param_groups
    if len(groups) != len(live):
        return (f"the checkpoint's optimizer has {counted(len(groups), 'parameter group')}, "
                f"the live one {len(live)}")
    for index, (group, live_group) in enumerate(zip(groups, live, strict=True)):
        if len(group["params"]) != len(live_group["params"]):
            return (f"parameter group {index} holds "
                    f"{counted(len(group['params']), 'parameter')} in the checkpoint, "
                    f"{len(live_group['params'])} in the live optimizer")
    if shapes is None:
        return None
    for index, (saved, current) in enumerate(zip(shapes, parameter_shapes(optimizer),
                                                 strict=True)):
        for position, (was, now) in enumerate(zip(saved, current, strict=True)):
            if list(was) != now:
                return (f"parameter {position} of group {index} has shape {tuple(was)} in "
                        f"the checkpoint, {tuple(now)} in the live optimizer")
    return None


def _scaler_problem(scaler: Any, value: Any) -> str | None:
    if not scaler.is_enabled():
        return None  # a disabled scaler ignores what it is given
    if isinstance(value, Mapping) and not value:
        return "the checkpoint holds the state of a disabled GradScaler"
    missing = sorted(set(scaler.state_dict()) - set(value if isinstance(value, Mapping) else ()))
    return f"the checkpoint's GradScaler state lacks {', '.join(missing)}" if missing else None


def _put_back(state: MutableMapping[str, Any] | Mapping[str, Any], name: str, value: Any,
              strict: bool) -> None:
    import torch

    obj = state[name]
    kind = kind_of(obj)
    if kind == STATEFUL:
        try:
            if isinstance(obj, torch.nn.Module):
                obj.load_state_dict(value, strict=strict)
            else:
                obj.load_state_dict(value)
        except (RuntimeError, ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"cannot restore {name!r}: {one_line(error)}") from error
    elif kind == TENSOR:
        with torch.no_grad():
            obj.copy_(value)
    elif kind == GENERATOR:
        obj.set_state(value)
    else:
        cast(MutableMapping[str, Any], state)[name] = value  # checked: it is one
