"""What can go wrong with a checkpoint, as exceptions and warnings users can catch."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint could not be saved or restored; the message says what to do."""


class CheckpointStorageError(CheckpointError):
    """The folder failed a save or a listing (a full or read-only disk, a lost mount, an
    I/O error), or the writer process died: the previous checkpoints are untouched, and a
    later try may succeed. ``__cause__`` holds the OSError, where there is one; ``step``
    is the step whose save failed, where one did."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


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
