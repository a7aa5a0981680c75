"""Checkpoints survive SIGKILL, a full disk, damaged files and hostile pickles.

Writers run in forked children (torch is already imported here, so a child starts in
milliseconds) and are killed with a real SIGKILL; every check reads the real files back.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import json
import os
import pathlib
import random
import resource
import signal
import struct
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import FORK, in_child

from ipycloud.runtime.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CheckpointWarning,
    UnsafeCheckpointError,
    catalog,
    integrity,
)
from ipycloud.runtime.durable import FileDigest
from ipycloud.runtime.per_process import reset_process_state

ELEMENTS = 1 << 20  # 4 MiB of float32 per checkpoint: a write takes real time
KILL_TRIALS = 60
MAX_KILL_DELAY_S = 0.25


def crc32_of(path: Path) -> str:
    """CRC-32 of a file, computed here rather than by the code under test."""
    return f"{zlib.crc32(path.read_bytes()):08x}"


def manifests(folder: Path) -> dict[str, dict[str, Any]]:
    """Checkpoint name -> parsed manifest, for every manifest JSON in the folder."""
    return {path.stem: json.loads(path.read_text()) for path in folder.glob("step-*.json")}


def assert_complete(folder: Path, name: str) -> dict[str, Any]:
    """The named checkpoint has a manifest and a data file whose size and hash match it."""
    manifest = json.loads((folder / f"{name}.json").read_text())
    data = folder / f"{name}.pt"
    entry = manifest["files"][data.name]
    assert data.stat().st_size == entry["size"], name
    assert crc32_of(data) == entry["crc32"], name
    return manifest


def assert_tidy(folder: Path) -> None:
    """No temporary file remains, and every data file has its manifest."""
    names = {path.name for path in folder.iterdir()}
    assert not [name for name in names if name.startswith(".tmp-")], sorted(names)
    orphans = [name for name in names
               if name.endswith(".pt") and name[:-3] + ".json" not in names]
    assert not orphans, sorted(names)


def step_state(step: int) -> dict[str, Any]:
    """A state whose every value encodes the step."""
    return {"weights": torch.full((ELEMENTS,), float(step)), "step": step}


def blank_state() -> dict[str, Any]:
    """A state to load into, holding no step's values."""
    return {"weights": torch.full((ELEMENTS,), -1.0), "step": None}


# -- SIGKILL at a random instant ------------------------------------------------------------

def _save_until_killed(folder: str, report_fd: int) -> None:
    """Save steps 1, 2, ... forever, reporting each step once its save has returned."""
    torch.set_num_threads(1)
    manager = CheckpointManager(folder, keep_last=2)
    step = 0
    while True:
        step += 1
        manager.save(step_state(step), step=step)
        os.write(report_fd, struct.pack("<q", step))


def _completed_steps(read_fd: int) -> list[int]:
    """The steps the killed writer reported as saved, in order."""
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    data = b"".join(chunks)
    return [value for (value,) in struct.iter_unpack("<q", data[: len(data) // 8 * 8])]


def _phase_seen(folder: Path) -> str:
    """What the folder shows about where the writer was killed (for the summary)."""
    if not folder.is_dir():
        return "before the folder existed"
    names = {path.name for path in folder.iterdir()}
    found = manifests(folder)
    temporaries = [name for name in names if name.startswith(".tmp-")]
    if temporaries:
        final = temporaries[0].split("-", 3)[-1]  # .tmp-<pid>-<random>-<final name>
        kind = ("data file" if final.endswith(".pt") else "manifest"
                if final.endswith(".json") else f"{final} pointer")
        return f"while writing the {kind}"
    if any(name.endswith(".pt") and name[:-3] + ".json" not in names for name in names):
        return "between data and manifest (or mid-rotation)"
    if not found:
        return "before the first checkpoint"
    newest = max(found, key=lambda name: found[name]["sequence"])
    pointer = folder / "latest"
    if not pointer.exists() or pointer.read_text().strip() != newest:
        return "between manifest and latest pointer"
    if len(found) > 2:
        return "before rotation finished"
    return "between checkpoints"


@pytest.fixture(scope="module")
def phases() -> Iterator[collections.Counter[str]]:
    """Counts where kills landed; printed at the end (visible with -s)."""
    seen: collections.Counter[str] = collections.Counter()
    yield seen
    print(f"\nSIGKILL landed ({sum(seen.values())} trials):")
    for phase, count in seen.most_common():
        print(f"  {count:3d}  {phase}")


@pytest.mark.parametrize("trial", range(KILL_TRIALS))
def test_sigkill_at_a_random_instant_leaves_a_loadable_latest(
        trial: int, tmp_path: Path, phases: collections.Counter[str]) -> None:
    folder = tmp_path / "run"
    delay = random.Random(f"kill-{trial}").uniform(0.0, MAX_KILL_DELAY_S)
    read_fd, write_fd = os.pipe()
    writer = FORK.Process(target=_save_until_killed, args=(str(folder), write_fd))
    writer.start()
    os.close(write_fd)
    time.sleep(delay)
    os.kill(writer.pid, signal.SIGKILL)  # type: ignore[arg-type]
    writer.join(30)
    assert writer.exitcode == -signal.SIGKILL
    completed = _completed_steps(read_fd)
    os.close(read_fd)
    phases[_phase_seen(folder)] += 1

    folder.mkdir(exist_ok=True)  # the child may have died before creating it
    manager = CheckpointManager(folder, keep_last=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # a kill damages nothing complete
        latest = manager.latest()
    if latest is None:
        assert not completed, f"saves of steps {completed} returned, yet latest() is None"
    else:
        last = completed[-1] if completed else 0
        # The newest completed save, or the one being committed when the kill came.
        assert latest.step in (last, last + 1), (latest.step, completed)
        assert_complete(folder, latest.name)
        state = blank_state()
        info = manager.load(state)
        assert info.name == latest.name
        assert state["step"] == info.step
        assert torch.all(state["weights"] == float(info.step))

    pointer = folder / "latest"
    if pointer.exists():
        named = pointer.read_text().strip()
        assert assert_complete(folder, named)["step"] >= (completed[-1] if completed else 0)

    before = manifests(folder)
    saved = manager.save(step_state(1000), step=1000)
    assert saved is not None and saved.step == 1000
    assert_tidy(folder)
    after = manifests(folder)
    assert saved.name in after
    assert len(after) == min(2, len(before) + 1)
    assert pointer.read_text().strip() == saved.name
    state = blank_state()
    assert manager.load(state).name == saved.name
    assert torch.all(state["weights"] == 1000.0)


# -- a full disk ------------------------------------------------------------------------------

def _fill_the_disk(folder: str, limit: int) -> dict[str, Any]:
    """Save a small checkpoint, cap file size below the next one, and try to save that."""
    manager = CheckpointManager(folder, keep_last=2)
    first = manager.save({"weights": torch.full((16,), 1.0), "step": 1}, step=1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes then fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        manager.save(step_state(2), step=2)
    except CheckpointError as error:
        cause = error.__cause__
        return {"first": first.name if first else None, "error": str(error),
                "type": type(error).__name__,
                "errno": cause.errno if isinstance(cause, OSError) else None}
    return {"first": first.name if first else None, "error": None}


def test_a_full_disk_fails_cleanly_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    limit = 256 * 1024
    result = in_child(_fill_the_disk, str(folder), limit)
    message = result["error"]
    assert message is not None, "a save larger than the file size limit succeeded"
    assert result["type"] == "CheckpointStorageError"
    assert result["errno"] == errno.EFBIG
    assert "\n" not in message
    assert message.startswith(f"could not write step-000000002 in {folder}")
    assert os.strerror(errno.EFBIG) in message

    names = sorted(path.name for path in folder.iterdir())
    assert not [name for name in names if name.startswith(".tmp-")], names
    assert [name for name in names if name.startswith("step-")] == [
        f"{result['first']}.json", f"{result['first']}.pt"]
    state = {"weights": torch.zeros(16), "step": None}
    info = CheckpointManager(folder).load(state)
    assert info.name == result["first"] and info.step == 1
    assert state["step"] == 1 and torch.all(state["weights"] == 1.0)


# -- damaged files ----------------------------------------------------------------------------

@pytest.fixture
def three_checkpoints(tmp_path: Path) -> tuple[CheckpointManager, list[Path]]:
    """Steps 1, 2, 3 saved in a fresh folder; returns the manager and the data files."""
    manager = CheckpointManager(tmp_path / "run", keep_last=None)
    infos = [manager.save(small_state(step), step=step) for step in (1, 2, 3)]
    return manager, [info.data_path for info in infos if info is not None]


def small_state(step: int) -> dict[str, Any]:
    """A 16 KiB state whose values encode the step."""
    return {"weights": torch.full((4096,), float(step)), "step": step}


def truncate(path: Path) -> None:
    """Cut the file to half its size."""
    os.truncate(path, path.stat().st_size // 2)


def flip_middle_bytes(path: Path) -> None:
    """Invert 8 bytes in the middle of the file, keeping its size."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for index in range(middle, middle + 8):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip_middle_bytes], ids=["truncated", "flipped"])
def test_damaged_newest_data_falls_back_with_a_warning(
        three_checkpoints: tuple[CheckpointManager, list[Path]],
        damage: Callable[[Path], None]) -> None:
    manager, data = three_checkpoints
    damage(data[2])
    state = {"weights": torch.zeros(4096), "step": None}
    with pytest.warns(CheckpointWarning, match=data[2].stem) as caught:
        info = manager.load(state)
    assert len(caught) == 1
    assert info.step == 2 and info.data_path == data[1]
    assert state["step"] == 2 and torch.all(state["weights"] == 2.0)
    with pytest.warns(CheckpointWarning, match=data[2].stem):
        assert manager.latest().step == 2  # type: ignore[union-attr]

    with pytest.raises(CheckpointError, match=f"{data[2].stem} is damaged"):
        manager.load(state, which=3)
    assert state["step"] == 2  # nothing was restored from the damaged file


@pytest.mark.parametrize("damage", [truncate, flip_middle_bytes], ids=["truncated", "flipped"])
def test_the_table_marks_the_newest_valid_checkpoint_latest_and_the_damaged_one(
        three_checkpoints: tuple[CheckpointManager, list[Path]],
        damage: Callable[[Path], None]) -> None:
    manager, data = three_checkpoints
    damage(data[2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # a listing shows, it does not warn
        table = manager.table()
    names = [row[0] for row in table.table()[1]]
    assert names == [data[0].stem, f"{data[1].stem} (latest)", f"{data[2].stem} (damaged)"]
    assert "(damaged)" in table._repr_html_()
    assert [info.status for info in table.infos] == ["complete", "complete", "damaged"]


def test_a_truncated_file_is_listed_as_damaged_without_reading_it(
        three_checkpoints: tuple[CheckpointManager, list[Path]]) -> None:
    manager, data = three_checkpoints
    truncate(data[0])
    data[1].unlink()
    assert [info.status for info in manager.list()] == ["damaged", "damaged", "complete"]


def test_a_checksum_known_to_this_process_spares_reading_the_file_again(
        three_checkpoints: tuple[CheckpointManager, list[Path]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    manager, data = three_checkpoints
    reads: list[Path] = []
    real_of = FileDigest.of.__func__  # type: ignore[attr-defined]

    def counted(cls: type[FileDigest], path: Path) -> FileDigest:
        reads.append(path)
        return real_of(cls, path)

    monkeypatch.setattr(FileDigest, "of", classmethod(counted))
    reset_process_state()  # as in a fresh process: no checksum known
    time.sleep(integrity.RACY_NS / 1e9)  # a stat taken from now on is trusted later
    state = small_state(0)
    manager.load(state)
    assert reads == [data[2]]  # read once...
    manager.load(state)
    manager.table()
    assert reads == [data[2]] and state["step"] == 3  # ...and known afterwards

    flip_middle_bytes(data[2])  # a write changes the stat: the file is read again
    with pytest.warns(CheckpointWarning, match=f"{data[2].stem} in .* is damaged"):
        assert manager.load(state).step == 2
    assert reads[1:] == [data[2], data[1]] and state["step"] == 2


def test_a_checksum_taken_in_the_tick_of_the_last_write_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "data.pt"
    path.write_bytes(b"weights")
    status = path.stat()
    written = status.st_mtime_ns
    integrity.remember(path, "0000abcd", status, taken_ns=written + integrity.RACY_NS - 1)
    assert integrity.known_crc32(path, status) is None
    integrity.remember(path, "0000abcd", status, taken_ns=written + integrity.RACY_NS)
    assert integrity.known_crc32(path, status) == "0000abcd"
    reset_process_state()
    assert integrity.known_crc32(path, status) is None


def test_garbage_manifest_is_skipped_with_a_warning(
        three_checkpoints: tuple[CheckpointManager, list[Path]]) -> None:
    manager, data = three_checkpoints
    manifest = data[2].with_suffix(".json")
    manifest.write_text('{"format": "ipycloud-checkpoint/1", "step": ')
    state = {"weights": torch.zeros(4096), "step": None}
    with pytest.warns(CheckpointWarning, match=manifest.name):
        info = manager.load(state)
    assert info.step == 2
    assert state["step"] == 2 and torch.all(state["weights"] == 2.0)
    with pytest.warns(CheckpointWarning, match=manifest.name), \
            pytest.raises(CheckpointError, match=r"step 3 .*steps saved: 1, 2\)"):
        manager.load(state, which=3)


def test_every_checkpoint_damaged_is_an_error_not_garbage(
        three_checkpoints: tuple[CheckpointManager, list[Path]]) -> None:
    manager, data = three_checkpoints
    for path in data:
        truncate(path)
    state = {"weights": torch.zeros(4096), "step": None}
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError, match="no valid"):
        manager.load(state)
    assert state["step"] is None and torch.all(state["weights"] == 0.0)


def test_the_newest_complete_checkpoint_wins_over_a_stale_pointer(tmp_path: Path) -> None:
    """A kill (or a failed write) between the newest manifest and the pointer."""
    folder = tmp_path / "run"
    manager = CheckpointManager(folder)
    for step in (1, 2, 3):
        manager.save({"step": step}, step=step)
    (folder / "latest").write_text("step-000000002\n")
    state = {"step": 0}
    assert manager.load(state).name == "step-000000003" and state["step"] == 3
    assert manager.latest().name == "step-000000003"  # type: ignore[union-attr]
    assert "step-000000003 (latest)" in str(manager.table())


def plant_manifest(folder: Path, stem: str, **fields: Any) -> None:
    """A manifest in ``folder`` as a tampered or hostile folder would hold it."""
    manifest = {"format": catalog.FORMAT, "name": stem, "step": 9, "sequence": 99,
                "time": time.time(), "files": {f"{stem}.pt": {"size": 4, "crc32": "0"}},
                **fields}
    (folder / f"{stem}.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("fields", [
    {"name": "../victim/precious"},
    {"files": {"../victim/precious.pt": {"size": 4, "crc32": "0"}}},
    {"files": {"step-000000009.pt": {"size": 4, "crc32": "0"},
               "/abs/precious.pt": {"size": 4, "crc32": "0"}}},
], ids=["name", "relative file", "absolute file"])
def test_a_manifest_naming_files_outside_its_folder_is_ignored(
        tmp_path: Path, fields: dict[str, Any]) -> None:
    """Rotation deletes, and loading reads, nothing outside the checkpoint folder."""
    victim = tmp_path / "victim"
    victim.mkdir()
    precious = {name: victim / name for name in ("precious.pt", "precious.json")}
    torch.save({"format": catalog.FORMAT, "state": {"step": -1}}, precious["precious.pt"])
    precious["precious.json"].write_text("{}")
    folder = tmp_path / "run"
    folder.mkdir()
    plant_manifest(folder, "step-000000009", **fields)
    manager = CheckpointManager(folder, keep_last=1)
    state = {"step": 0}
    with pytest.warns(CheckpointWarning, match="step-000000009.json"), \
            pytest.raises(CheckpointError, match="no valid"):
        manager.load(state)
    for step in (1, 2, 3):
        manager.save({"step": step}, step=step)
    with pytest.warns(CheckpointWarning, match="step-000000009.json"):
        assert manager.load(state).step == 3
    assert state["step"] == 3
    assert sorted(path.name for path in victim.iterdir()) == sorted(precious)


@pytest.mark.parametrize("fields", [
    {"step": "9"}, {"sequence": -1}, {"time": None}, {"metrics": {"loss": "low"}},
    {"files": {"step-000000009.pt": {"size": "4", "crc32": "0"}}},
])
def test_a_manifest_with_fields_of_the_wrong_kind_is_skipped(
        tmp_path: Path, fields: dict[str, Any]) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder)
    manager.save({"step": 1}, step=1)
    plant_manifest(folder, "step-000000009", **fields)
    state = {"step": 0}
    with pytest.warns(CheckpointWarning, match="step-000000009.json"):
        assert manager.load(state).step == 1
    assert [info.step for info in manager.list()] == [1]


# -- a pickle that runs code ------------------------------------------------------------------

class Payload:
    """Unpickling this creates ``marker``: code run by merely loading the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (self.marker,))


def test_a_pickle_that_runs_code_is_refused_unless_allowed(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    info = manager.save(small_state(1), step=1)
    assert info is not None
    marker = tmp_path / "code-ran"
    torch.save(Payload(marker), info.data_path)
    data = info.data_path.read_bytes()
    catalog.write_manifest(dataclasses.replace(info, files={info.data_path.name: {
        "size": len(data), "crc32": f"{zlib.crc32(data):08x}"}}))

    state = {"weights": torch.zeros(4096), "step": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # the manifest matches: no fallback
        with pytest.raises(UnsafeCheckpointError) as refused:
            manager.load(state)
    message = str(refused.value)
    assert "unsafe_allow_pickle=True" in message and str(info.data_path) in message
    assert "Unsupported global: GLOBAL getattr" in message  # it names what was refused
    assert "\n" not in message
    assert not marker.exists()
    assert state["step"] is None

    with pytest.warns(CheckpointWarning, match="unsafe_allow_pickle=True"), \
            pytest.raises(CheckpointError, match="is not an ipycloud checkpoint"):
        manager.load(state, unsafe_allow_pickle=True)
    assert marker.exists()  # the opt-in really does run the file's code
