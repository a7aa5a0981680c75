"""Checkpoints users can trust: atomic, rotating, asynchronous, verified, bit-exact resume.

``CheckpointManager`` is the entry point; the modules beside it each do one part:
``catalog`` (the folder layout), ``state`` (live objects to saveable state and back),
``rng`` (random generator states), ``auto`` (the objects registered for automatic saving).
Atomic, durable file writes come from ``ipycloud.runtime.durable``.
"""

from ipycloud.runtime.checkpoint.catalog import CheckpointInfo, CheckpointTable
from ipycloud.runtime.checkpoint.errors import (
    CheckpointError,
    CheckpointWarning,
    UnsafeCheckpointError,
)
from ipycloud.runtime.checkpoint.manager import CheckpointManager, default_directory

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointTable",
    "CheckpointWarning",
    "UnsafeCheckpointError",
    "default_directory",
]
