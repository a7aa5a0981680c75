"""Resuming ``fit`` from a checkpoint, and saying what the checkpoint decided."""

from __future__ import annotations

from typing import Any

_COMPARED = (bool, int, float, str, tuple, type(None))


def check_resume(resume: bool | str | int, has_checkpoint_folder: bool) -> None:
    """ValueError for a ``resume`` that cannot mean anything here."""
    if resume == "auto" or resume is False:
        return
    if not isinstance(resume, bool | str | int):
        raise TypeError(f"resume must be 'auto', True, False, a step or a tag, not {resume!r}")
    if not has_checkpoint_folder:
        raise ValueError(f"resume={resume!r} needs checkpoint= (a folder or a "
                         "CheckpointManager) to resume from")


def hyper_parameters(optimizer: Any, scheduled: bool) -> list[dict[str, Any]]:
    """Each parameter group's settings (not its parameters); with a scheduler, the
    learning rate the schedule started from instead of the current one."""
    groups = []
    for group in optimizer.param_groups:
        settings = {key: value for key, value in group.items()
                    if key != "params" and isinstance(value, _COMPARED)}
        if scheduled and "initial_lr" in group:
            settings["lr"] = group["initial_lr"]
            settings.pop("initial_lr")
        groups.append(settings)
    return groups


def changed_settings(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """'lr 0.1 (this cell: 0.01)' for each setting the checkpoint replaced."""
    changes = []
    for index, (mine, saved) in enumerate(zip(before, after, strict=False)):
        prefix = f"group {index} " if len(before) > 1 else ""
        changes += [f"{prefix}{key} {saved[key]!r} (this cell: {value!r})"
                    for key, value in mine.items() if key in saved and saved[key] != value]
    return changes


def taken_from_checkpoint_line(changes: list[str]) -> str | None:
    if not changes:
        return None
    return ("ipycloud.fit: taken from the checkpoint, not from this cell: " + ", ".join(changes)
            + "; pass resume=False to start afresh with this cell's values")

