"""Checkpoints users can trust: atomic, rotating, asynchronous, verified, bit-exact resume.

Holds the checkpoint manager and its parts; may import ``machine`` and the shared helpers.
``CheckpointManager`` is the entry point; the modules beside it each do one part:
``catalog`` (the folder layout and its table), ``integrity`` (files against their
manifest, checksums this process knows), ``state`` (live objects to saveable state),
``restore`` (saved state back into live objects, all or nothing), ``rng`` (random
generator states), ``runs`` (which checkpoints each live writer owns), ``auto`` (the
objects registered for automatic saving), ``per_folder`` (the one manager of each
folder that every front shares), ``data_file`` (the data file's
serialization), ``background`` (the thread that carries an asynchronous save),
``shared_buffers``, ``writer_process`` and ``writer_child`` (host copies in shared memory,
written by a child process). Atomic, durable file writes come from
``ipycloud.runtime.durable``.
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
