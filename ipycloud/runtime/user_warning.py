"""Warnings placed at the user's line: the first caller outside ipycloud and IPython.

A fixed ``stacklevel`` names the user's line from one path only; ipycloud warns from
paths of different depths (a save, a load, a reader fed by a follower), and the magics
run under IPython's own frames. Python 3.12 has ``skip_file_prefixes`` for this; 3.10 and
3.11 do not.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

_IPYCLOUD = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` at the first frame that is neither ipycloud's
    nor IPython's (a notebook cell, a script); at the caller where every frame is theirs."""
    skipped = _skipped_prefixes()
    frame: FrameType | None = sys._getframe(1)  # warn's caller: warnings.warn's level 2
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)


def _skipped_prefixes() -> tuple[str, ...]:
    """ipycloud's folder, and IPython's where it is loaded (its frames run the magics)."""
    ipython = sys.modules.get("IPython")
    where = getattr(ipython, "__file__", None)
    return (_IPYCLOUD,) if where is None else (_IPYCLOUD, os.path.dirname(where) + os.sep)
