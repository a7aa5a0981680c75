"""Checkpoints users can trust: atomic, rotating, asynchronous, verified, bit-exact resume.

Holds the checkpoint manager and its parts; may import ``machine`` and the shared helpers.
``CheckpointManager`` is the entry point; the modules beside it each do one part:
``catalog`` (the folder layout and its table), ``integrity`` (files against their
manifest, checksums this process knows), ``state`` (live objects to saveable state),
``save_details`` (what a save records beside the state), ``rotation`` (removing what the
keep rules no longer cover), ``selection`` (which checkpoint "latest", "best", a step or
a tag picks), ``loading`` (torch.load of a verified file), ``restore`` (saved state back
into live objects, all or nothing), ``rng`` (random generator states), ``leases`` (which
checkpoints each live writer owns), ``fallback`` (the local folder that stands in for a
failing one), ``resilient`` (saves that write around a failing folder), ``auto`` (the
objects registered for automatic saving), ``per_folder`` (the one manager of each folder
that every front shares), ``data_file`` (the data file's serialization),
``background_saves`` (a manager's saves in the background: staging, writing, waiting),
``background`` (the thread that carries them), ``shared_buffers``, ``writer_process``
and ``writer_child`` (host copies in shared memory, written by a child process). Atomic,
durable file writes come from ``ipycloud.runtime.durable``.
"""

from ipycloud.runtime.checkpoint.catalog import CheckpointInfo, CheckpointTable
from ipycloud.runtime.checkpoint.errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointStorageError,
    CheckpointWarning,
    UnsafeCheckpointError,
)
from ipycloud.runtime.checkpoint.manager import KEEP_LAST, CheckpointManager, default_directory
from ipycloud.runtime.checkpoint.per_folder import manager_for

__all__ = [
    "KEEP_LAST",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointStorageError",
    "CheckpointTable",
    "CheckpointWarning",
    "UnsafeCheckpointError",
    "default_directory",
    "manager_for",
]
