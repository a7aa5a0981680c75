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
from ipycloud.runtime.untrusted import NotRegular, is_count, is_unix_time, load_json, read_small

FORMAT = "ipycloud-checkpoint/1"
DATA_SUFFIX = ".pt"
MANIFEST_SUFFIX = ".json"
LATEST_POINTER = "latest"
MAX_MANIFEST_BYTES = 4 << 20  # a longer manifest is not one of ours
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
        metrics = fields.get("metrics")
        if isinstance(metrics, dict):  # a metric that was not finite is not one to rank by
            fields["metrics"] = {name: value for name, value in metrics.items()
                                 if value is not None}
        try:
            info = cls(directory=directory, **fields)
        except TypeError:
            raise ValueError("a manifest has the fields of CheckpointInfo only") from None
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
            or not is_count(files[data_file].get("size"))
            or not isinstance(files[data_file].get("crc32"), str)):
        raise ValueError(f"a manifest lists the files of {data_file} only, with size and crc32")
    for field_name in ("step", "sequence"):
        if not is_count(getattr(info, field_name)):
            raise ValueError(f"{field_name} must be a non-negative integer")
    if info.epoch is not None and not is_count(info.epoch):
        raise ValueError("epoch must be a non-negative integer or null")
    if not is_unix_time(info.time):
        raise ValueError("time must be a Unix time")
    if info.run is not None and not (isinstance(info.run, str) and _RUN.match(info.run)):
        raise ValueError(f"not a run id: {info.run!r}")
    if info.tag is not None and not (isinstance(info.tag, str) and _TAG.match(info.tag)):
        raise ValueError(f"not a tag: {info.tag!r}")
    if not isinstance(info.metrics, dict) or not all(
            isinstance(value, int | float) and not isinstance(value, bool)
            for value in info.metrics.values()):
        raise ValueError("metrics must map names to numbers")
    _check_descriptions(info)


def _check_descriptions(info: CheckpointInfo) -> None:
    """ValueError unless what the manifest says of its contents has the types it should."""
    if not _text_map(info.objects, nullable=False) or not _text_map(info.versions,
                                                                     nullable=True):
        raise ValueError("objects and versions must map names to text")
    if not isinstance(info.rng, list) or not all(isinstance(name, str) for name in info.rng):
        raise ValueError("rng must list names")
    rule = info.keep_best
    if rule is not None and not (isinstance(rule, list) and len(rule) == 3
                                 and isinstance(rule[0], str) and rule[1] in ("min", "max")
                                 and is_count(rule[2]) and rule[2] >= 1):
        raise ValueError("keep_best must be [metric, 'min' or 'max', count]")


def _text_map(value: Any, nullable: bool) -> bool:
    return isinstance(value, dict) and all(
        isinstance(item, str) or (nullable and item is None) for item in value.values())


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
    """The checkpoints in a folder, oldest first, and the manifests that are not sound
    (not JSON, not a manifest, over MAX_MANIFEST_BYTES, not a regular file: a FIFO is
    never waited on).

    A manifest removed while the folder is listed (rotated away) is left out; any other
    OSError (a lost mount, an I/O error) is raised: the folder cannot be read now.
    """
    infos, unreadable = [], []
    for manifest in sorted(directory.glob(f"step-*{MANIFEST_SUFFIX}")):
        if not is_checkpoint_name(manifest.stem):
            continue
        try:
            text = read_small(manifest, MAX_MANIFEST_BYTES, follow_links=True)
            infos.append(parse_manifest(text, manifest.stem, directory))
        except FileNotFoundError:
            continue
        except (ValueError, NotRegular):
            unreadable.append(manifest.name)
    infos.sort(key=lambda info: info.sequence)
    return infos, unreadable


def parse_manifest(data: bytes, name: str, directory: Path) -> CheckpointInfo:
    """The checkpoint ``name`` of ``directory`` as the manifest holding ``data`` describes
    it; raises ValueError when it is not its sound manifest."""
    info = CheckpointInfo.from_manifest(load_json(data), directory)
    if info.name != name:
        raise ValueError(f"{name}{MANIFEST_SUFFIX} describes {info.name}")
    return info


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
