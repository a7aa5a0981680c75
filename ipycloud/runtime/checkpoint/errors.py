"""What can go wrong with a checkpoint, as exceptions and warnings users can catch."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint could not be saved or restored; the message says what to do."""


class UnsafeCheckpointError(CheckpointError):
    """The checkpoint holds pickled objects that could run code when loaded."""


class CheckpointInUseError(CheckpointError):
    """Every checkpoint that "latest" or "best" could pick belongs to a run that another
    live process writes."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (failed verification) and an older one is used instead."""
