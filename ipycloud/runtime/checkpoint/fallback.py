"""The local folder that holds a checkpoint folder's saves while it fails.

When a mounted folder (Drive, a network disk) fails, training goes on saving into a folder
on the machine's own scratch disk, ``<scratch>/ipycloud-fallback/<name>-<hash>``, named
after the failing folder so that every process on the machine finds it. Everything that
knows of that folder is here (``FallbackFolder``): its path; reading both folders, where
the newest complete checkpoint wins wherever it lies; the runs other live processes write
in either; and the manager that saves into it, continuing the folder's run. When to save
there and when to copy back is ``resilient``'s.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ipycloud.runtime.checkpoint import catalog, leases
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo

if TYPE_CHECKING:
    from ipycloud.runtime.checkpoint.manager import CheckpointManager

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


class FallbackFolder:
    """A checkpoint folder and the local folder that stands in for it while it fails.

    ``fallback`` is "auto" (``fallback_directory``, found at first use), a folder, or None
    for none.
    """

    def __init__(self, directory: Path, fallback: str | os.PathLike[str] | None) -> None:
        self.directory = directory
        self._path: Path | Literal["auto"] | None = (
            None if fallback is None else "auto" if fallback == "auto" else Path(fallback))
        self.manager: CheckpointManager | None = None  # saves into it, once made

    @property
    def path(self) -> Path | None:
        """The fallback folder, or None."""
        if self._path == "auto":
            self._path = fallback_directory(self.directory)
        return self._path

    def read(self) -> tuple[list[CheckpointInfo], list[str]]:
        """The checkpoints of the folder and of the fallback folder, oldest first, and the
        manifests that are not sound (see ``read_both``)."""
        path = self.path
        return read_both(self.directory, path if path != self.directory else None)

    def exists(self) -> bool:
        """Whether the folder or the fallback folder exists."""
        path = self.path
        return self.directory.is_dir() or (path is not None and path.is_dir())

    def live_runs(self) -> dict[str, leases.Writer]:
        """The runs in either folder that another live process writes (not this one's)."""
        others = leases.live_elsewhere(self.directory)
        path = self.path
        if path is not None:
            others |= leases.live_elsewhere(path)
        others.pop(leases.claimed(self.directory) or "", None)
        return others

    def saving_manager(self, make: Callable[[Path], CheckpointManager]
                       ) -> CheckpointManager | None:
        """The manager that saves into the fallback folder, continuing the folder's run;
        ``make(folder)`` makes it at the first call. None without a fallback folder."""
        path = self.path
        if path is None:
            return None
        if self.manager is None:
            leases.adopt(path, leases.claimed(self.directory))
            self.manager = make(path)
        return self.manager
