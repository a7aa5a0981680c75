"""Checks of ``fit``'s arguments, each failing with a one-line error that names the fix."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ipycloud.runtime.messages import os_reason
from ipycloud.runtime.untrusted import is_count

if TYPE_CHECKING:
    from ipycloud.runtime.checkpoint import CheckpointManager
    from ipycloud.runtime.train.device import DeviceChoice
    from ipycloud.runtime.train.precision import Precision

DEFAULT_CHECKPOINT_EVERY_S = 600.0  # fit's periodic saves, unless told otherwise


@dataclass
class RunPlan:
    """Everything about one run of ``fit`` fixed, and checked, before the first step."""

    choice: DeviceChoice
    precision: Precision
    compile: bool | str
    epochs: int | None
    max_steps: int | None
    grad_accum: int
    clip_grad_norm: float | None
    checkpoint_every: tuple[float | None, int | None]  # (seconds, steps): one is None
    log_every: int
    metrics: dict[str, Any]


def check_arguments(model: Any, optimizer: Any, train_data: Any, epochs: Any,
                    max_steps: Any, grad_accum: Any, log_every: Any) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, not "
                        f"{type(optimizer).__name__}")
    if not isinstance(train_data, Iterable) or isinstance(train_data, str | bytes):
        raise TypeError(f"train_data must be a DataLoader or an iterable of batches, not "
                        f"{type(train_data).__name__}")
    if epochs is not None and max_steps is not None:
        raise ValueError("give epochs or max_steps, not both")
    for name, value in (("epochs", epochs), ("max_steps", max_steps), ("grad_accum", grad_accum),
                        ("log_every", log_every)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    mine = {id(parameter) for parameter in model.parameters()}
    if not any(id(parameter) in mine for group in optimizer.param_groups
               for parameter in group["params"]):
        raise ValueError("the optimizer holds none of the model's parameters: build it from "
                         "this model, e.g. torch.optim.AdamW(model.parameters())")


def check_numbers(clip_grad_norm: Any, seed: Any) -> None:
    """TypeError or ValueError for a ``clip_grad_norm`` or a ``seed`` fit cannot use."""
    if clip_grad_norm is not None and (isinstance(clip_grad_norm, bool) or not isinstance(
            clip_grad_norm, int | float) or not clip_grad_norm > 0):
        raise ValueError(f"clip_grad_norm must be a positive number (the largest gradient "
                         f"norm), not {clip_grad_norm!r}")
    if seed is not None and not is_count(seed):  # a checkpoint keeps it exactly
        raise ValueError(f"seed must be a whole number from 0 to 2**53, not {seed!r}")


def check_progress(progress: Any) -> None:
    if progress not in (True, False, "bar") or not isinstance(progress, bool | str):
        raise ValueError(f"progress must be True (a bar, and live curves in a notebook), "
                         f"'bar' (the bar only) or False, not {progress!r}")


def checkpoint_schedule(every: Any, every_steps: Any) -> tuple[float | None, int | None]:
    """(seconds, steps) between periodic saves: ``every`` a duration ("10m", or seconds;
    10 minutes when neither is given), or ``every_steps`` optimizer steps, not both."""
    from ipycloud.runtime.units import parse_duration

    if every_steps is not None:
        if isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1:
            raise ValueError(f"checkpoint_every_steps must be a number of optimizer steps "
                             f">= 1, not {every_steps!r}")
        if every is not None:
            raise ValueError("give checkpoint_every (a duration) or checkpoint_every_steps "
                             "(a number of steps), not both")
        return None, every_steps
    if every is None:
        return DEFAULT_CHECKPOINT_EVERY_S, None
    if isinstance(every, str):
        return parse_duration(every), None
    if isinstance(every, int | float) and not isinstance(every, bool) and every > 0:
        return float(every), None
    raise TypeError(f"checkpoint_every is a duration such as '10m' or a number of seconds, "
                    f"not {every!r}; to save every N steps, pass checkpoint_every_steps=N")


def checkpoint_manager(checkpoint: Any) -> CheckpointManager | None:
    from ipycloud.runtime.checkpoint import CheckpointManager, manager_for

    if checkpoint is None:
        return None
    if isinstance(checkpoint, str | os.PathLike):
        manager = manager_for(checkpoint)
    elif isinstance(checkpoint, CheckpointManager):
        manager = checkpoint
    else:
        raise TypeError("checkpoint must be a folder or a CheckpointManager, not "
                        f"{type(checkpoint).__name__}")
    try:
        a_file = manager.directory.exists() and not manager.directory.is_dir()
    except OSError as error:
        raise unreadable_at_start(manager.directory, error) from error
    if a_file:
        raise ValueError(f"checkpoint= must be a folder, and {manager.directory} is a file: "
                         "name a folder (made if missing)")
    return manager


def unreadable_at_start(directory: Any, error: BaseException) -> Exception:
    """The error for a checkpoint folder that cannot be read before training starts."""
    from ipycloud.runtime.checkpoint import CheckpointStorageError

    why = os_reason(error) or error
    return CheckpointStorageError(f"cannot read the folder {directory}: {why}: nothing was "
                                  "trained; rerun once it can be read (a lost Drive mount: "
                                  "%mount_storage drive --force)")


def check_epoch_metric(metric: str, what: str, has_validation: bool,
                       metric_names: Iterable[str]) -> None:
    """ValueError unless the epochs of this run report ``metric`` (watched by ``what``)."""
    if metric == "train_loss":
        return
    reported = ["train_loss"]
    if has_validation:
        reported += ["val_loss", "val_accuracy", *(f"val_{name}" for name in metric_names)]
        if metric in reported:
            return
    elif metric.startswith("val_"):
        raise ValueError(f"{what} watches {metric!r}, which only val_data= gives: pass "
                         "val_data, or watch 'train_loss'")
    raise ValueError(f"{what} watches {metric!r}, which no epoch of this run reports (they "
                     f"report {', '.join(reported)})")


def check_release(release: Any, has_checkpoint_folder: bool) -> None:
    """TypeError or ValueError for a ``release`` that cannot be honoured."""
    if not isinstance(release, bool):
        raise TypeError(f"release must be True or False, not {release!r}")
    if release and not has_checkpoint_folder:
        raise ValueError("release=True needs checkpoint= (a folder or a CheckpointManager): "
                         "the machine goes only once the final checkpoint is saved there")
