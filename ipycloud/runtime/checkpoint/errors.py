"""What can go wrong with a checkpoint, as exceptions and warnings users can catch."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint could not be saved or restored; the message says what to do."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not fit the live objects; nothing was restored.

    ``reason`` says what does not fit; ``hint`` (or None) names the ``strict=False`` that
    would restore the rest. The message is both.
    """

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason if hint is None else f"{reason}{hint}")
        self.reason, self.hint = reason, hint


class UnsafeCheckpointError(CheckpointError):
    """The checkpoint holds pickled objects that could run code when loaded."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (failed verification) and an older one is used instead."""
