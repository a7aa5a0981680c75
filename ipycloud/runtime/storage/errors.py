"""The one error every failed storage operation raises, and the warning of storage."""

from __future__ import annotations


class StorageError(Exception):
    """A mount, download, extraction, Kaggle or Drive transfer that failed; the message is
    one line and says what to do. Bad arguments are ValueError, as elsewhere."""


class StorageWarning(UserWarning):
    """Nothing written here outlives the session."""
