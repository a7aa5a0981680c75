"""A checkpoint folder as the soaks see it, read without the code under test.

Manifests are parsed here, and every data file is checked against its manifest's size
and CRC-32 computed here with ``zlib``. Temporary files and data files without a manifest
are the leftovers of a killed writer; where they lie tells where a kill landed.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEMPORARY = re.compile(r"^\.tmp-(\d+)-[0-9a-f]{8}-(.*)$")  # durable.temp_name_for's names
CHECKPOINT = re.compile(r"^step-(\d{9,})(?:-[A-Za-z][A-Za-z0-9_.-]*)?(?:\.\d+)?$")
LATEST = "latest"
LEASE_PREFIX = ".ipycloud-run-"

# Where a kill landed, as the folder shows it right after the kill (the first that applies).
IN_DATA_FILE = "writing a data file"
BEFORE_MANIFEST = "between a data file and its manifest"
IN_MANIFEST = "writing a manifest"
IN_POINTER = "writing the latest pointer"
BEFORE_POINTER = "between a manifest and the latest pointer"
IN_ROTATION = "rotating old checkpoints away"
IN_LEASE = "writing the run's lease"
NOTHING_ON_DISK = "no trace on disk"


@dataclass(frozen=True)
class Manifest:
    name: str
    step: int
    sequence: int
    run: str | None
    size: int
    crc32: str


@dataclass
class FolderState:
    """What one look at a checkpoint folder found."""

    manifests: dict[str, Manifest] = field(default_factory=dict)
    corrupt: list[str] = field(default_factory=list)  # "name: why"
    temporaries: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)  # data files no manifest names
    latest_pointer: str | None = None
    leases: int = 0

    @property
    def left_behind(self) -> list[str]:
        return self.temporaries + self.orphans

    def newest(self) -> Manifest | None:
        return max(self.manifests.values(), key=lambda found: found.sequence, default=None)

    def steps(self) -> list[int]:
        return sorted(found.step for found in self.manifests.values())


def inspect(folder: Path) -> FolderState:
    """Read every manifest and check every data file; list what should not be there."""
    state = FolderState()
    if not folder.is_dir():
        return state
    names = {path.name for path in folder.iterdir()}
    for name in sorted(names):
        if TEMPORARY.match(name):
            state.temporaries.append(name)
        elif name.startswith(LEASE_PREFIX):
            state.leases += 1
        elif name.endswith(".json") and CHECKPOINT.match(name[:-5]):
            found = _manifest(folder / name)
            if isinstance(found, str):
                state.corrupt.append(f"{name}: {found}")
            else:
                state.manifests[found.name] = found
                if problem := _data_problem(folder, found):
                    state.corrupt.append(f"{found.name}: {problem}")
    state.orphans = sorted(name for name in names if name.endswith(".pt")
                           and CHECKPOINT.match(name[:-3]) and name[:-3] not in state.manifests)
    if LATEST in names:
        state.latest_pointer = (folder / LATEST).read_text().strip()
    return state


def _manifest(path: Path) -> Manifest | str:
    try:
        fields: dict[str, Any] = json.loads(path.read_text())
        data = fields["files"][f"{fields['name']}.pt"]
        return Manifest(fields["name"], int(fields["step"]), int(fields["sequence"]),
                        fields.get("run"), int(data["size"]), str(data["crc32"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"unreadable manifest ({type(error).__name__}: {error})"


def _data_problem(folder: Path, manifest: Manifest) -> str | None:
    path = folder / f"{manifest.name}.pt"
    try:
        data = path.read_bytes()
    except OSError as error:
        return f"data file unreadable ({error.strerror})"
    if len(data) != manifest.size:
        return f"data file has {len(data)} bytes, the manifest says {manifest.size}"
    if f"{zlib.crc32(data):08x}" != manifest.crc32:
        return "data file fails its CRC-32"
    return None


def landing(state: FolderState, keep_last: int | None) -> str:
    """Where a kill landed in a save, from the folder right after it (see the constants)."""
    for name in state.temporaries:
        final = _group(TEMPORARY, name, 2)
        if final.startswith(LEASE_PREFIX):
            return IN_LEASE
        if final == LATEST:
            return IN_POINTER
        return IN_MANIFEST if final.endswith(".json") else IN_DATA_FILE
    newest = state.newest()
    for orphan in state.orphans:
        step = int(_group(CHECKPOINT, orphan[:-3], 1))
        return BEFORE_MANIFEST if newest is None or step > newest.step else IN_ROTATION
    if newest is not None and state.latest_pointer != newest.name:
        return BEFORE_POINTER
    if newest is not None and keep_last is not None:
        own = [found for found in state.manifests.values() if found.run == newest.run]
        if len(own) > keep_last:
            return IN_ROTATION
    return NOTHING_ON_DISK


def _group(pattern: re.Pattern[str], name: str, group: int) -> str:
    """A group of a name already known to match ``pattern``."""
    matched = pattern.match(name)
    assert matched is not None, name
    return matched.group(group)
