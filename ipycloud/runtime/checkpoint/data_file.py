"""Writing a checkpoint's data file: torch.save, atomically and durably, with its digest."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ipycloud.runtime._optional import require
from ipycloud.runtime.durable import (
    FileDigest,
    commit_temporary,
    write_temporary,
)

_SERIALIZE_LOCK = threading.Lock()


def write_data_file(path: Path, payload: dict[str, Any]) -> FileDigest:
    """Serialize ``payload`` to ``path`` so that it appears whole or not at all."""
    temporary, digest = write_data_temporary(path, payload)
    commit_temporary(temporary, path)
    return digest


def write_data_temporary(path: Path, payload: dict[str, Any]) -> tuple[Path, FileDigest]:
    """Serialize ``payload`` to a durable temporary file beside ``path``, to be committed
    with ``durable.commit_temporary``; returns its name and digest."""
    torch = require("torch", "torch")
    return write_temporary(path, lambda file: _serialize(torch, payload, file))


def _serialize(torch: Any, payload: dict[str, Any], file: Any) -> None:
    """torch.save without torch's own per-record CRC-32: the manifest's checksum covers it.

    The switch is process-wide, so it is flipped under a lock and always put back.
    """
    options = torch.serialization
    if not hasattr(options, "set_crc32_options"):
        torch.save(payload, file)
        return
    with _SERIALIZE_LOCK:
        previous = options.get_crc32_options()
        options.set_crc32_options(False)
        try:
            torch.save(payload, file)
        finally:
            options.set_crc32_options(previous)
