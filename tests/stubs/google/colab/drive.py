"""``google.colab.drive`` with the real signatures, simulating Drive's FUSE mount with a
folder.

``BEHAVIOUR`` picks what ``mount`` does: "ok" creates ``<mountpoint>/MyDrive``,
"timeout" and "refused" raise as Colab does; with "push fails", ``flush_and_unmount``
raises as Colab does when Drive does not take the cached writes. ``calls`` records every
call of ``mount`` (its arguments), ``flushes`` every ``timeout_ms`` of
``flush_and_unmount``.
"""

from __future__ import annotations

import os
from typing import Any

BEHAVIOUR = "ok"
calls: list[dict[str, Any]] = []
flushes: list[int] = []


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


def flush_and_unmount(timeout_ms: int = 24 * 60 * 60 * 1000) -> None:
    """Push the writes Drive's mount caches to Drive, then unmount it (here: record the
    call, or fail as Colab does: its ``drive --push_changes_and_quit`` exited non-zero)."""
    flushes.append(timeout_ms)
    if BEHAVIOUR == "push fails":
        raise ValueError("flush_and_unmount failed")
