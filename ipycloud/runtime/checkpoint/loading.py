"""Loading a checkpoint's data file with torch, only once it verifies."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ipycloud.runtime._optional import require
from ipycloud.runtime.checkpoint import catalog, integrity
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.checkpoint.errors import (
    CheckpointError,
    CheckpointWarning,
    UnsafeCheckpointError,
)
from ipycloud.runtime.durable import side_by_side
from ipycloud.runtime.user_warning import warn


def load_verified(candidates: Iterable[CheckpointInfo], directory: Path, map_location: Any,
                  unsafe: bool, damaged: Callable[[CheckpointInfo, str], object]
                  ) -> tuple[CheckpointInfo, dict[str, Any]]:
    """The first of ``candidates`` that verifies, with its loaded payload; each that fails
    goes to ``damaged(info, problem)`` (which may raise). CheckpointError when none
    verifies (``directory`` is the folder they came from).

    The checksum is computed while torch reads the file (or known already: see
    ``integrity``), and nothing is restored unless it matches. An unsafe load runs the
    file's code, so it verifies first.
    """
    for info in candidates:
        if unsafe or integrity.trusted(info):
            problem = integrity.problem(info)
            if problem is None:
                return info, torch_load(info, map_location, unsafe)
        else:
            problem, (payload, failure) = side_by_side(
                lambda: integrity.problem(info),  # noqa: B023 (waited for here)
                lambda: _load_or_failure(info, map_location))  # noqa: B023
            if problem is None:
                if failure is not None:
                    raise failure
                return info, payload
        damaged(info, problem)
    raise CheckpointError(f"no valid checkpoint in {directory}")


def _load_or_failure(info: CheckpointInfo,
                     map_location: Any) -> tuple[dict[str, Any], Exception | None]:
    """A safe load's payload, or the exception it raised (a damaged file raises too)."""
    try:
        return torch_load(info, map_location, unsafe=False), None
    except Exception as error:
        return {}, error


def torch_load(info: CheckpointInfo, map_location: Any, unsafe: bool) -> dict[str, Any]:
    """The payload of ``info``'s data file, by ``torch.load(weights_only=not unsafe)``;
    UnsafeCheckpointError for a file a safe load refuses, CheckpointError for one that is
    no ipycloud checkpoint."""
    torch = require("torch", "torch")
    if unsafe:
        warn(f"loading {info.data_path} with unsafe_allow_pickle=True: the file can "
             "run any code it carries", CheckpointWarning)
        payload = torch.load(info.data_path, map_location=map_location, weights_only=False)
    else:
        try:
            payload = torch.load(info.data_path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            reason = _refusal_reason(str(error))
            raise UnsafeCheckpointError(
                f"refusing {info.data_path}: it holds objects a safe load does not allow "
                f"({reason}). Only if you made this file yourself, load it with "
                "unsafe_allow_pickle=True") from None
    if (not isinstance(payload, dict) or payload.get("format") != catalog.FORMAT
            or not isinstance(payload.get("state"), dict)):
        raise CheckpointError(f"{info.data_path} is not an ipycloud checkpoint")
    return payload


def _refusal_reason(message: str) -> str:
    """The sentence of torch's weights_only refusal that names what was refused."""
    found = re.search(r"WeightsUnpickler error: (.*?)(?: Please |\n|$)", message)
    if found:
        return found.group(1).strip()
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown reason"
