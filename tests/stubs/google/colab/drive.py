"""``google.colab.drive`` with the real signature, simulating Drive's FUSE mount with a folder.

``BEHAVIOUR`` picks what ``mount`` does: "ok" creates ``<mountpoint>/MyDrive``,
"timeout" and "refused" raise as Colab does. ``calls`` records every call's arguments.
"""

from __future__ import annotations

import os
from typing import Any

BEHAVIOUR = "ok"
calls: list[dict[str, Any]] = []


def mount(mountpoint: str, force_remount: bool = False, timeout_ms: int = 120000,
          readonly: bool = False) -> None:
    """Mount Drive at ``mountpoint`` (here: create ``MyDrive`` in it)."""
    calls.append({"mountpoint": mountpoint, "force_remount": force_remount,
                  "timeout_ms": timeout_ms, "readonly": readonly})
    if BEHAVIOUR == "timeout":
        raise TimeoutError("Timed out waiting for the authorisation")
    if BEHAVIOUR == "refused":
        raise ValueError("mount failed")
    if os.path.isdir(os.path.join(mountpoint, "MyDrive")) and not force_remount:
        raise ValueError("Mountpoint must not already contain files")
    os.makedirs(os.path.join(mountpoint, "MyDrive"), exist_ok=True)
