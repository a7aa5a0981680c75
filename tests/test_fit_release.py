"""``fit(release=True)`` gives the machine back only once the run is safe in its folder: on
Colab (the stub records ``google.colab.runtime.unassign``), in a script, and in a real
kernel, which shuts down with the message. A failed or paused run, a final checkpoint that
fails when read back, or a final sync that fails keeps the machine and says why."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kernels import kernel
from test_fit_callbacks import problem

import ipycloud
from ipycloud.runtime.checkpoint import CheckpointWarning
from ipycloud.runtime.storage import filesystem
from ipycloud.runtime.storage.periodic_sync import BackgroundSync
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.history import History

RELEASED_ON_COLAB = "ipycloud.fit: the run is saved and verified: releasing this Colab machine"
KEEPING = "ipycloud.fit: release=True: keeping the machine: "


def train(folder: Any, **options: Any) -> History:
    model, optimizer, data = problem(32)
    return ipycloud.fit(model, optimizer, data, device="cpu", progress=False,
                        checkpoint=folder, release=True, **{"epochs": 2, **options})


def unassigned() -> list[tuple[()]]:
    from google.colab import runtime  # the stub

    return runtime.calls


@pytest.fixture
def colab(colab_stub: None) -> Iterator[None]:
    from google.colab import drive  # the stub

    unassigned().clear()
    drive.flushes.clear()
    yield
    drive.BEHAVIOUR = "ok"


@pytest.fixture
def drive_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder that the mount table lists as Drive's FUSE mount (fuse.drive), as
    ``drive.mount`` leaves /content/drive on Colab; the mount table is this machine's,
    with that line added."""
    mounted = tmp_path / "drive"
    (mounted / "MyDrive").mkdir(parents=True)
    point = str(mounted.resolve()).replace("\\", "\\134").replace(" ", "\\040")
    table = tmp_path / "mountinfo"
    table.write_text(filesystem.MOUNTINFO.read_text() + f"990 1 0:990 / {point} rw,nosuid,"
                     "nodev,relatime shared:990 - fuse.drive drive rw,user_id=0,group_id=0\n")
    monkeypatch.setattr(filesystem, "MOUNTINFO", table)
    return mounted / "MyDrive"


def pushed_when(drive_files: Path, released: list[str],
                monkeypatch: pytest.MonkeyPatch) -> None:
    """Note in ``released`` Drive's flush (with the names under ``drive_files`` then) and
    the machine's release, in their order."""
    from google.colab import drive, runtime

    flush = drive.flush_and_unmount

    def flush_and_unmount(timeout_ms: int = 24 * 60 * 60 * 1000) -> None:
        names = sorted(path.name for path in drive_files.rglob("step-*"))
        released.append(f"flush {' '.join(names)}")
        flush(timeout_ms)

    monkeypatch.setattr(drive, "flush_and_unmount", flush_and_unmount)
    monkeypatch.setattr(runtime, "unassign", lambda: released.append("unassign"))


def test_on_colab_the_machine_goes_once_the_final_sync_to_drive_is_flushed(
        colab: None, tmp_path: Path, drive_folder: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder, drive = tmp_path / "run one", drive_folder / "run copy"
    folder.mkdir()
    BackgroundSync(folder, drive, every_s=3600).start()  # its first pass ran at the start
    released: list[str] = []
    pushed_when(drive, released, monkeypatch)

    history = train(folder)

    assert len(history.epochs) == 2
    final = ipycloud.CheckpointManager(folder).latest()
    assert final is not None and final.step == 8
    assert released[-1] == "unassign" and len(released) == 2
    assert set(final.files) <= set(released[0].split()[1:])
    assert capsys.readouterr().out.splitlines()[-1] == RELEASED_ON_COLAB


def test_on_colab_a_folder_on_drive_is_flushed_before_the_machine_goes(
        colab: None, drive_folder: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from google.colab import drive

    folder = drive_folder / "checkpoints" / "run"
    released: list[str] = []
    pushed_when(folder, released, monkeypatch)

    train(folder)

    final = ipycloud.CheckpointManager(folder).latest()
    assert final is not None and final.step == 8
    assert released == [f"flush {' '.join(sorted(path.name for path in folder.rglob('step-*')))}",
                        "unassign"]
    assert final.data_path.name in released[0]
    assert drive.flushes == [3_600_000]
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "ipycloud.fit: pushing the writes Drive's mount still caches to Drive "
        "(google.colab.drive.flush_and_unmount) before releasing", RELEASED_ON_COLAB]


def test_on_colab_a_drive_that_does_not_take_the_writes_keeps_the_machine(
        colab: None, drive_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from google.colab import drive

    drive.BEHAVIOUR = "push fails"
    train(drive_folder / "run")
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{KEEPING}flushing Drive failed (ValueError: flush_and_unmount failed): Drive may "
        "not have the run yet")
    assert unassigned() == []


def test_on_colab_a_folder_on_the_machine_s_own_disk_keeps_the_machine(
        colab: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    words = (f"{KEEPING}{folder} is on this machine's own disk and no sync copies it to "
             "storage that outlives the machine, so its only copy would go with it: pass "
             "checkpoint= a folder on Drive (ipycloud.mount() mounts it), or sync this one "
             "to Drive (%mount_storage sync)")
    train(folder)
    assert capsys.readouterr().out.splitlines()[-1] == words

    BackgroundSync(folder, tmp_path / "copy", every_s=3600).start()  # on the same disk
    train(folder, epochs=3)
    assert capsys.readouterr().out.splitlines()[-1] == words
    assert unassigned() == []


def test_a_final_save_that_fails_keeps_the_machine(
        colab: None, small_tmpfs: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    folder = small_tmpfs("1m") / "run"
    manager = ipycloud.CheckpointManager(folder, fallback=None)

    class FillTheDiskInTheLastEpoch(Callback):
        def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
            if epoch == 2:
                fill(folder)

    with pytest.warns(CheckpointWarning, match="step 12 is not saved"):
        train(manager, epochs=3, checkpoint_every_steps=4, callbacks=[FillTheDiskInTheLastEpoch()])
    assert [info.step for info in manager.list()] == [4, 8]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{KEEPING}the final checkpoint (step 12) is not saved; the newest is step 8, in "
        f"{folder}")
    assert unassigned() == []


def fill(folder: Path) -> None:
    """Fill the file system of ``folder`` up: the next write finds no space."""
    descriptor = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(descriptor, b"\0" * size)
    finally:
        os.close(descriptor)


def test_on_colab_a_run_that_fails_or_pauses_keeps_the_machine(
        colab: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(outputs: Any, targets: Any) -> Any:
        raise ValueError("labels out of range")

    with pytest.raises(ValueError):
        train(tmp_path / "failing", loss_fn=broken)
    assert capsys.readouterr().out.splitlines()[-1] == KEEPING + "the run failed"

    class InterruptAt2(Callback):
        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            if step == 2:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "paused", callbacks=[InterruptAt2()])
    assert capsys.readouterr().out.splitlines()[-1] == KEEPING + "the run paused"
    assert unassigned() == []


def test_a_final_checkpoint_damaged_when_read_back_keeps_the_machine(
        colab: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Damage(Callback):
        """Flips a byte of each checkpoint once written (its size stays)."""

        def on_checkpoint(self, info: Any) -> None:
            path = info.directory / next(iter(info.files))
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))

    train(tmp_path / "run", callbacks=[Damage()])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(KEEPING + "the final checkpoint step-")
    assert last.endswith("fails its check when read back: step-000000008.pt fails its CRC-32 "
                         "check")
    assert unassigned() == []


def test_a_final_sync_that_fails_keeps_the_machine(
        colab: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, drive = tmp_path / "run", tmp_path / "drive"
    folder.mkdir()
    BackgroundSync(folder, drive, every_s=3600).start()

    class UnmountDrive(Callback):
        def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
            shutil.rmtree(drive, ignore_errors=True)  # as a lost mount leaves it

    train(folder, callbacks=[UnmountDrive()])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"{KEEPING}the final sync {folder} -> {drive} failed: ")
    assert unassigned() == []


def test_release_needs_a_checkpoint_folder(colab: None) -> None:
    with pytest.raises(ValueError, match=r"^release=True needs checkpoint= \(a folder or a "
                                         r"CheckpointManager\): the machine goes only once"):
        train(None)


def test_in_a_script_the_process_ends_after_saying_why(
        local_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        train(tmp_path / "run")
    assert ended.value.code == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "ipycloud.fit: the run is saved and verified: ending this process to free the machine")


def test_in_a_real_kernel_the_kernel_shuts_down_with_the_message(tmp_path: Path) -> None:
    folder = tmp_path / "run 'one'"
    cell = (
        "import torch, ipycloud\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 2)\n"
        "data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(\n"
        "    torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8)\n"
        "ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=2,\n"
        f"             device='cpu', progress=False, checkpoint={str(folder)!r},\n"
        "             release=True)\n"
        "print('after fit')\n")
    with kernel(tmp_path) as (manager, client):
        texts: list[str] = []
        client.execute(cell)
        deadline = time.monotonic() + 120
        while manager.is_alive() and time.monotonic() < deadline:
            try:
                message = client.get_iopub_msg(timeout=1)
            except Exception:  # queue.Empty: no output this second
                continue
            if message["msg_type"] == "stream":
                texts.append(message["content"]["text"])
        assert not manager.is_alive(), "".join(texts)
    output = "".join(texts)
    assert ("ipycloud.fit: the run is saved and verified: shutting this kernel down to free "
            "the machine\nafter fit\n") in output
    assert any(path.name.startswith("step") for path in folder.iterdir())
