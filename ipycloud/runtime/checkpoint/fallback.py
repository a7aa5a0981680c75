"""The local folder that holds a checkpoint folder's saves while it fails.

When a mounted folder (Drive, a network disk) fails, training goes on saving into a folder
on the machine's own scratch disk, ``<scratch>/ipycloud-fallback/<name>-<hash>``, named
after the failing folder so that every process on the machine finds it. A manager reads
both: the newest complete checkpoint wins wherever it lies.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ipycloud.runtime.checkpoint import catalog
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo

FOLDER = "ipycloud-fallback"


def fallback_directory(directory: Path) -> Path:
    """The scratch folder that stands in for ``directory`` while it fails."""
    from ipycloud.runtime.machine.platform import detect_platform

    absolute = os.path.abspath(directory)
    digest = hashlib.sha256(absolute.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(absolute).name).strip("-.")[:40] or "root"
    return detect_platform().scratch_dir / FOLDER / f"{name}-{digest}"


def read_both(directory: Path, fallback: Path | None) -> tuple[list[CheckpointInfo], list[str]]:
    """The checkpoints of ``directory`` and of its ``fallback`` folder, oldest first by the
    time of their save (of a checkpoint and its copy, the folder's comes last: it wins),
    and the manifests that are not sound.

    ``directory`` failing to be read raises its OSError; the fallback folder is read where
    it exists and can be read.
    """
    infos, unreadable = catalog.read_catalog(directory)
    if fallback is None:
        return infos, unreadable
    try:
        extra, extra_unreadable = catalog.read_catalog(fallback)
    except OSError:
        return infos, unreadable
    merged = sorted([*infos, *extra], key=lambda info: (info.time, info.directory == directory,
                                                        info.sequence))
    return merged, unreadable + [f"{fallback / name}" for name in extra_unreadable]
