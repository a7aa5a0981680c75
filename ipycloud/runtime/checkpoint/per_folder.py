"""One checkpoint manager per folder in this process, shared by every front.

``fit(checkpoint=folder)``, ``%checkpoint`` and the automatic checkpoint all write through
``manager_for(folder)``, so one folder has one writer: an asynchronous save from one is
waited for by the next save from another, and rotation sees every checkpoint.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ipycloud.runtime.checkpoint.manager import (
    KEEP_LAST,
    CheckpointManager,
    check_keep_last,
    close_all,
)
from ipycloud.runtime.per_process import per_process

_lock = threading.Lock()


@per_process(close=lambda managers: close_all(managers.values()))
def _managers() -> dict[Path, CheckpointManager]:
    """Each folder's manager, by its absolute path."""
    return {}


def manager_for(directory: str | os.PathLike[str],
                keep_last: int | None = KEEP_LAST) -> CheckpointManager:
    """The manager of ``directory`` (made on first use); ``keep_last`` as asked last applies."""
    check_keep_last(keep_last)
    folder = Path(directory).expanduser()
    key = Path(os.path.abspath(folder))  # one manager, however the folder is named
    with _lock:
        managers = _managers()
        manager = managers.get(key)
        if manager is None:
            manager = managers[key] = CheckpointManager(folder, keep_last)
        manager.keep_last = keep_last
        return manager
