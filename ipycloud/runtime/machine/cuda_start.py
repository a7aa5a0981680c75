"""Whether torch has initialised CUDA in this process, and where a front saw it happen.

A notebook front notes the cell after which CUDA was first up (``note_cuda_started``);
``launch`` names it when it cannot start its ranks in a way that CUDA allows. Neither
function imports torch or initialises CUDA.
"""

from __future__ import annotations

import sys
from typing import Any

_started_where: list[str] = []  # at most one: the first place noted


def initialised_torch_cuda() -> Any:
    """``torch.cuda`` when torch is imported and has initialised CUDA here, else None."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    return cuda if cuda is not None and cuda.is_initialized() else None


def cuda_initialised() -> bool:
    """True when torch is imported and has initialised CUDA in this process."""
    return initialised_torch_cuda() is not None


def note_cuda_started(where: str) -> None:
    """Remember ``where`` (e.g. "cell In [3] (x = torch.ones(1).cuda())") as the place
    CUDA was first initialised; later notes are ignored."""
    if not _started_where:
        _started_where.append(where)


def cuda_started_where() -> str | None:
    """Where CUDA was first initialised, as noted by a front, or None."""
    return _started_where[0] if _started_where else None
