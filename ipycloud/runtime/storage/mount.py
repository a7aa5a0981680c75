"""The persistent project folder of this platform, mounted when it needs mounting.

``mount()`` finds (on Colab: mounts) the storage that outlives the session and creates
a project folder in it with ``data/ models/ checkpoints/ logs/ outputs/``.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipycloud.runtime.machine.platform import Platform, detect_platform
from ipycloud.runtime.messages import one_line, worded
from ipycloud.runtime.per_process import per_process
from ipycloud.runtime.storage import tree
from ipycloud.runtime.storage.errors import StorageError, StorageWarning
from ipycloud.runtime.user_warning import warn

PROJECT_FOLDERS = ("data", "models", "checkpoints", "logs", "outputs")
KINDS = ("auto", "drive", "kaggle", "local")
DEFAULT_PROJECT = "default"


class MountError(StorageError):
    """The persistent storage could not be mounted; the message says what to do."""


@dataclass(frozen=True)
class MountResult:
    """Where the project lives, and whether it survives the session."""

    kind: str  # "drive", "kaggle" or "local"
    project: Path
    persistent: bool
    inputs: tuple[tuple[str, int], ...] = ()  # Kaggle: attached inputs and their sizes

    def summary(self) -> str:
        lasting = "kept after the session" if self.persistent else "LOST when the session ends"
        text = f"project folder {self.project} ({self.kind}, {lasting})"
        if self.inputs:
            from ipycloud.runtime.units import format_bytes

            listed = ", ".join(f"{name} ({format_bytes(size)})" for name, size in self.inputs)
            text += f"; inputs: {listed}"
        return text

    def __str__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())


class _Mounts:
    """The mounts made in this process; the latest is what downloads default to."""

    def __init__(self) -> None:
        self.latest: MountResult | None = None


@per_process()
def _mounts() -> _Mounts:
    return _Mounts()


def mount(kind: str = "auto", *, project: str | None = None, force: bool = False,
          root: str | os.PathLike[str] | None = None, timeout_s: float = 120,
          platform: Platform | None = None) -> MountResult:
    """Mount or find the persistent storage and create the project folder in it.

    ``kind="auto"`` follows the platform: ``/content/drive/MyDrive/<project>`` on Colab
    (Drive is mounted first), ``/kaggle/working/<project>`` on Kaggle, and
    ``<root>/<project>`` elsewhere, ``root`` defaulting to ``ipycloud`` in the platform's
    persistent folder (``/storage`` on Paperspace, the home folder on Studio Lab and local
    machines). ``force`` remounts Drive, which mends a stale mount. ``platform`` defaults
    to the detected one.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown storage kind {kind!r}: use one of {', '.join(KINDS)}")
    name = _project_name(project)
    platform = detect_platform() if platform is None else platform
    chosen = {"colab": "drive", "kaggle": "kaggle"}.get(platform.key, "local")
    if kind != "auto" and kind != chosen and kind != "local":
        raise worded(MountError, "{kind} storage is not available on {platform}: use {auto} "
                     "or {local}", kind=kind, platform=platform.name, auto="kind='auto'",
                     local="kind='local'")
    kind = chosen if kind == "auto" else kind
    folder = _storage_root(kind, platform, root, force, timeout_s)
    result = MountResult(kind, _make_project(folder / name),
                         platform.persistent_dir is not None,
                         _kaggle_inputs(folder) if kind == "kaggle" else ())
    if not result.persistent:
        warn(f"nothing persists on {platform.name}: {result.project} is lost when "
             "the session ends; download what you need", StorageWarning)
    _mounts().latest = result
    return result


def last_mount() -> MountResult | None:
    """What ``mount()`` last returned in this process, or None."""
    return _mounts().latest


def data_folder() -> Path:
    """Where downloads go by default: ``data`` in the mounted project, else ``./data``."""
    mounted = last_mount()
    return mounted.project / "data" if mounted is not None else Path.cwd() / "data"


def _storage_root(kind: str, platform: Platform, root: str | os.PathLike[str] | None,
                  force: bool, timeout_s: float) -> Path:
    """The folder that holds project folders, for this kind of storage."""
    if kind == "drive":
        return _mount_drive(platform, force, timeout_s)
    if kind == "kaggle":
        return platform.persistent_dir or Path("/kaggle/working")
    if root is not None:
        return Path(root).expanduser()
    return (platform.persistent_dir or platform.scratch_dir) / "ipycloud"


def _project_name(project: str | None) -> str:
    name = DEFAULT_PROJECT if project is None else project
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"invalid project name {name!r}: use a plain folder name")
    return name


def _make_project(project: Path) -> Path:
    try:
        for folder in PROJECT_FOLDERS:
            (project / folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MountError(f"cannot create the project folder {project}: "
                         f"{error.strerror or error}") from error
    return project


def _mount_drive(platform: Platform, force: bool, timeout_s: float) -> Path:
    """Mount Google Drive at the platform's mount point; reuse a healthy mount."""
    my_drive = platform.persistent_dir or Path("/content/drive/MyDrive")
    mount_point = my_drive.parent
    state = _drive_state(my_drive)
    if state == "healthy" and not force:
        return my_drive
    if state == "stale" and not force:
        raise worded(MountError, "the Drive mount at {mount_point} is stale (transport "
                     "endpoint is not connected): mount again with {force}",
                     mount_point=str(mount_point), force="force=True")
    try:
        from google.colab import drive
    except ImportError:
        raise worded(MountError, "Google Drive can only be mounted from a Colab notebook: "
                     "use {local} elsewhere", local="kind='local'") from None
    try:
        drive.mount(str(mount_point), force_remount=force or state == "stale",
                    timeout_ms=int(timeout_s * 1000))
    except Exception as error:  # Colab raises ValueError or TimeoutError with its reason
        raise worded(MountError, "mounting Drive at {mount_point} failed ({reason}): run the "
                     "cell again and accept the authorisation, or use {force}",
                     mount_point=str(mount_point), reason=one_line(error),
                     force="force=True") from error
    if _drive_state(my_drive) != "healthy":
        raise worded(MountError, "Drive was mounted but {my_drive} is not readable: try {force}",
                     my_drive=str(my_drive), force="force=True")
    return my_drive


def _drive_state(my_drive: Path) -> str:
    """"healthy", "stale" (FUSE lost its connection) or "absent"."""
    try:
        os.listdir(my_drive)
    except FileNotFoundError:
        return "absent"
    except OSError as error:
        if error.errno == errno.ENOTCONN:
            return "stale"
        return "absent"
    return "healthy"


def _kaggle_inputs(working: Path) -> tuple[tuple[str, int], ...]:
    """The datasets attached under ``input`` beside ``working``, with their sizes."""
    inputs = working.parent / "input"
    if not inputs.is_dir():
        return ()
    return tuple((entry.name, _tree_size(entry)) for entry in sorted(inputs.iterdir()))


def _tree_size(path: Path) -> int:
    """Bytes of the regular files at or under ``path`` (links inside are not followed)."""
    try:
        info = path.stat()
    except OSError:
        return 0
    if stat.S_ISREG(info.st_mode):
        return info.st_size
    listing, _ = tree.scan(str(path))
    return sum(entry.st_size for entry in listing.values() if stat.S_ISREG(entry.st_mode))

