"""The layout of a checkpoint folder, and reading it back.

Each checkpoint is two files: ``<name>.pt`` (the state, written with torch.save) and
``<name>.json`` (its manifest: step, metrics, versions, and the size and CRC-32 of the
data file). The manifest is written last, atomically: a checkpoint exists exactly when its
manifest does. ``latest`` names the newest checkpoint, for people and scripts: a kill
between a manifest and the pointer leaves it stale, so loading never relies on it.
"""

from __future__ import annotations

import html
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.durable import write_bytes_atomically
from ipycloud.runtime.tables import Table, aligned_lines, html_table
from ipycloud.runtime.units import counted, format_bytes

FORMAT = "ipycloud-checkpoint/1"
DATA_SUFFIX = ".pt"
MANIFEST_SUFFIX = ".json"
LATEST_POINTER = "latest"
BEST = "best"  # which= word for the best checkpoint by the keep_best metric
COMPLETE, WRITING, DAMAGED = "complete", "writing", "damaged"  # CheckpointInfo.status
_NAME = re.compile(r"^step-\d{9,}(-[A-Za-z][A-Za-z0-9_.-]*)?(\.\d+)?$")
_TAG = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_RUN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class CheckpointInfo:
    """One complete checkpoint, as its manifest describes it."""

    name: str
    directory: Path
    step: int
    sequence: int  # order of saving in this folder: larger is newer
    time: float  # Unix time of the save
    tag: str | None = None
    epoch: int | None = None
    data_position: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)  # name -> how it was captured
    rng: list[str] = field(default_factory=list)  # generators whose state is included
    versions: dict[str, str | None] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # file -> size, crc32
    keep_best: list[Any] | None = None  # the saving manager's [metric, mode, count]
    run: str | None = None  # the run it belongs to (see ``runs``); None before runs existed
    status: str = COMPLETE  # as listed: complete, writing (in the background) or damaged

    @property
    def data_path(self) -> Path:
        return self.directory / f"{self.name}{DATA_SUFFIX}"

    @property
    def manifest_path(self) -> Path:
        return self.directory / f"{self.name}{MANIFEST_SUFFIX}"

    @property
    def size(self) -> int:
        """Bytes of the checkpoint's data files."""
        return sum(int(entry["size"]) for entry in self.files.values())

    def to_manifest(self) -> dict[str, Any]:
        """The JSON manifest written beside the data file."""
        manifest = asdict(self)
        del manifest["directory"], manifest["status"]
        return {"format": FORMAT, **manifest}

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], directory: Path) -> CheckpointInfo:
        """Parse a manifest; raises ValueError when it is not one of ours.

        Folders are shared and downloaded, so a manifest is untrusted: its name must be a
        checkpoint name and its only file that name's data file, so that nothing it names
        lies outside ``directory``.
        """
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"not an {FORMAT} manifest")
        fields = {key: value for key, value in manifest.items() if key != "format"}
        info = cls(directory=directory, **fields)
        _check_fields(info)
        return info

    def summary(self) -> str:
        """One line: name, step, tag, size and when it was saved."""
        tag = f", tag {self.tag}" if self.tag else ""
        return (f"checkpoint {self.name}: step {self.step}{tag}, {format_bytes(self.size)}, saved "
                f"{_when(self.time)} in {self.directory}")

    def __str__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())


def _check_fields(info: CheckpointInfo) -> None:
    """ValueError unless the fields that name files and order checkpoints are sound."""
    if not isinstance(info.name, str) or not is_checkpoint_name(info.name):
        raise ValueError(f"not a checkpoint name: {info.name!r}")
    data_file = f"{info.name}{DATA_SUFFIX}"
    files = info.files
    if (not isinstance(files, dict) or set(files) != {data_file}
            or not isinstance(files[data_file], dict)
            or not _is_count(files[data_file].get("size"))
            or not isinstance(files[data_file].get("crc32"), str)):
        raise ValueError(f"a manifest lists the files of {data_file} only, with size and crc32")
    for field_name in ("step", "sequence"):
        if not _is_count(getattr(info, field_name)):
            raise ValueError(f"{field_name} must be a non-negative integer")
    if isinstance(info.time, bool) or not isinstance(info.time, int | float):
        raise ValueError("time must be a number")
    if info.run is not None and not (isinstance(info.run, str) and _RUN.match(info.run)):
        raise ValueError(f"not a run id: {info.run!r}")
    if not isinstance(info.metrics, dict) or not all(
            isinstance(value, int | float) for value in info.metrics.values()):
        raise ValueError("metrics must map names to numbers")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate_tag(tag: str | None) -> None:
    """Tags name checkpoints: a letter first, then letters, digits, '-', '_' or '.'.

    'latest' and 'best' are refused: as ``which=`` they choose by recency and by metric.
    """
    if tag is not None and (not _TAG.match(tag) or tag in (LATEST_POINTER, BEST)):
        raise ValueError(f"invalid tag {tag!r}: start with a letter and use only letters, "
                         "digits, '-', '_' and '.' (at most 64), and not 'latest' or 'best'")


# Names hold the step in nine digits (step-000001200), so they sort by step.
MAX_STEP = 10**9 - 1


def base_name(step: int, tag: str | None) -> str:
    """``step-000000100[-tag]``: the name of a checkpoint unless the folder has it already."""
    return f"step-{step:09d}" + (f"-{tag}" if tag else "")


def new_name(step: int, tag: str | None, directory: Path) -> str:
    """A name no file in ``directory`` uses yet: ``step-000000100[-tag][.N]``."""
    base = base_name(step, tag)
    name, counter = base, 1
    while (directory / f"{name}{MANIFEST_SUFFIX}").exists() or (
            directory / f"{name}{DATA_SUFFIX}").exists():
        name, counter = f"{base}.{counter}", counter + 1
    return name


def is_checkpoint_name(name: str) -> bool:
    return bool(_NAME.match(name))


def read_catalog(directory: Path) -> tuple[list[CheckpointInfo], list[str]]:
    """The checkpoints in a folder, oldest first, and the manifests that are not sound.

    A manifest removed while the folder is listed (rotated away) is left out; any other
    OSError (a lost mount, an I/O error) is raised: the folder cannot be read now.
    """
    infos, unreadable = [], []
    for manifest in sorted(directory.glob(f"step-*{MANIFEST_SUFFIX}")):
        if not is_checkpoint_name(manifest.stem):
            continue
        try:
            info = CheckpointInfo.from_manifest(json.loads(manifest.read_text()), directory)
            if info.name != manifest.stem:
                raise ValueError(f"{manifest.name} describes {info.name}")
            infos.append(info)
        except FileNotFoundError:
            continue
        except (ValueError, TypeError):
            unreadable.append(manifest.name)
    infos.sort(key=lambda info: info.sequence)
    return infos, unreadable


def write_manifest(info: CheckpointInfo) -> None:
    """Commit a checkpoint: its manifest appears atomically, after its data."""
    text = json.dumps(info.to_manifest(), indent=2, sort_keys=True, allow_nan=False)
    write_bytes_atomically(info.manifest_path, text.encode())


def write_latest_pointer(directory: Path, name: str) -> None:
    """Name the newest checkpoint in the file ``latest``: a hint for people and scripts;
    loading never relies on it (the newest complete manifest wins)."""
    write_bytes_atomically(directory / LATEST_POINTER, f"{name}\n".encode())


class CheckpointTable:
    """``list()`` as a table: text in a terminal, HTML in a notebook.

    ``latest`` is the checkpoint "latest" loads: the newest that verifies. A checkpoint
    still being written or found damaged says so beside its name, and so does one that
    lies in another folder (a fallback folder's).
    """

    HEADERS = ("name", "step", "epoch", "tag", "metrics", "size", "saved")

    def __init__(self, directory: Path, infos: list[CheckpointInfo],
                 latest: CheckpointInfo | None) -> None:
        self.directory = directory
        self.infos = infos
        self.latest = latest

    def table(self) -> Table:
        rows = [(info.name + self._note(info), str(info.step),
                 "" if info.epoch is None else str(info.epoch), info.tag or "",
                 ", ".join(f"{key}={value:.4g}" for key, value in info.metrics.items()),
                 "" if info.status == WRITING else format_bytes(info.size), _when(info.time))
                for info in self.infos]
        return self.HEADERS, rows

    def _note(self, info: CheckpointInfo) -> str:
        notes = [] if info.status == COMPLETE else [info.status]
        if self.latest is not None and info.data_path == self.latest.data_path:
            notes.append("latest")
        if info.directory != self.directory:
            notes.append(f"in {info.directory}")
        return f" ({', '.join(notes)})" if notes else ""

    def __str__(self) -> str:
        if not self.infos:
            return f"no checkpoints in {self.directory}"
        title = f"{counted(len(self.infos), 'checkpoint')} in {self.directory}"
        return "\n".join([title, *aligned_lines(*self.table())])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        folder = html.escape(str(self.directory))
        if not self.infos:
            return f"<p>no checkpoints in <code>{folder}</code></p>"
        return (f"<p>{counted(len(self.infos), 'checkpoint')} in <code>{folder}</code></p>"
                + html_table(self.table()))


def _when(unix_time: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_time))
