"""Automatic checkpoints: the live objects registered to be saved without being asked.

``%checkpoint auto model optimizer --every 10m`` registers them here. They are saved when
a save is due: after each notebook cell (``maybe_save()``) and between the optimizer steps
of ``ipycloud.fit`` (on rank 0), and when the session is about to end (``save_now()``,
called by the session guard on deadline or SIGTERM). One registration per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.checkpoint.errors import CheckpointStorageError
from ipycloud.runtime.checkpoint.manager import CheckpointManager
from ipycloud.runtime.checkpoint.resilient import resilient_saver
from ipycloud.runtime.units import format_duration


@dataclass
class AutoCheckpoint:
    """What to save automatically, where, and how often."""

    manager: CheckpointManager
    collect: Callable[[], Mapping[str, Any]]  # the live objects, looked up at save time
    names: tuple[str, ...]
    every_s: float  # seconds between saves
    last_saved_at: float = field(default_factory=time.monotonic)
    last_saved: CheckpointInfo | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def due(self, now: float | None = None) -> bool:
        """Whether ``every_s`` has passed since the last save."""
        now = time.monotonic() if now is None else now
        return now - self.last_saved_at >= self.every_s

    def save_now(self) -> CheckpointInfo:
        """Save the registered objects now, as the next step in the folder.

        A failing folder is written around (``resilient``): the save goes to the fallback
        folder, with a warning. CheckpointStorageError only when it went nowhere. Saves
        never overlap: a second caller waits for the first to finish.
        """
        with self._lock:
            saver = resilient_saver(self.manager)
            step = saver.next_step()
            info = saver.save(self.collect(), step)
            if info is None:
                raise CheckpointStorageError(f"step {step} could not be saved in "
                                             f"{self.manager.directory} or its fallback folder")
            self.last_saved, self.last_saved_at = info, time.monotonic()
            return info

    def maybe_save(self) -> CheckpointInfo | None:
        """Save if a save is due; returns the checkpoint written, if any."""
        return self.save_now() if self.due() else None

    def describe(self) -> str:
        """One line of status for people."""
        last = self.last_saved.name if self.last_saved else "nothing yet"
        return (f"auto checkpoint of {', '.join(self.names)} every "
                f"{format_duration(self.every_s)} into "
                f"{self.manager.directory}; last saved: {last}")

    def __str__(self) -> str:
        return self.describe()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.describe())


_registration_lock = threading.Lock()
_registered: AutoCheckpoint | None = None


def register(auto: AutoCheckpoint) -> AutoCheckpoint | None:
    """Make ``auto`` the process's automatic checkpoint; returns the one it replaces."""
    global _registered
    with _registration_lock:
        previous, _registered = _registered, auto
    return previous


def registered() -> AutoCheckpoint | None:
    """The process's automatic checkpoint, if one is registered."""
    return _registered


def unregister() -> AutoCheckpoint | None:
    """Remove the automatic checkpoint; returns it."""
    global _registered
    with _registration_lock:
        previous, _registered = _registered, None
    return previous
