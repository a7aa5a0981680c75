"""``fit(release=True)`` gives the machine back only once the run is safe in its folder: on
Colab (the stub records ``google.colab.runtime.unassign``), in a script, and in a real
kernel, which shuts down with the message. A failed or paused run, a final checkpoint that
fails when read back, or a final sync that fails keeps the machine and says why."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kernels import kernel
from test_fit_followers import problem

import ipycloud
from ipycloud.runtime.storage.background import BackgroundSync

RELEASED_ON_COLAB = "ipycloud.fit: the run is saved and verified: releasing this Colab machine"
KEEPING = "ipycloud.fit: release=True: keeping the machine: "


def train(folder: Path | None, **options: Any) -> ipycloud.History:
    model, optimizer, data = problem(32)
    return ipycloud.fit(model, optimizer, data, epochs=2, device="cpu", progress=False,
                        checkpoint=folder, release=True, **options)


def unassigned() -> list[tuple[()]]:
    from google.colab import runtime  # the stub

    return runtime.calls


@pytest.fixture
def colab(colab_stub: None) -> None:
    unassigned().clear()


def test_on_colab_the_machine_goes_once_the_final_sync_has_copied_the_checkpoint(
        colab: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from google.colab import runtime

    folder, drive = tmp_path / "run one", tmp_path / "drive copy"
    folder.mkdir()
    BackgroundSync(folder, drive, every_s=3600).start()  # its first pass ran at the start
    on_drive_when_released: list[list[str]] = []
    monkeypatch.setattr(runtime, "unassign", lambda: on_drive_when_released.append(
        sorted(path.name for path in drive.iterdir())))

    history = train(folder)

    assert len(history.epochs) == 2
    final = ipycloud.CheckpointManager(folder).latest()
    assert final is not None and final.step == 8
    assert set(final.files) <= set(on_drive_when_released[0])
    assert capsys.readouterr().out.splitlines()[-1] == RELEASED_ON_COLAB


def test_on_colab_a_run_that_fails_or_pauses_keeps_the_machine(
        colab: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(outputs: Any, targets: Any) -> Any:
        raise ValueError("labels out of range")

    with pytest.raises(ValueError):
        train(tmp_path / "failing", loss_fn=broken)
    assert capsys.readouterr().out.splitlines()[-1] == KEEPING + "the run failed"

    class InterruptAt2:
        def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
            if step == 2:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "paused", callbacks=[InterruptAt2()])
    assert capsys.readouterr().out.splitlines()[-1] == KEEPING + "the run paused"
    assert unassigned() == []


def test_a_final_checkpoint_damaged_when_read_back_keeps_the_machine(
        colab: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Damage:
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

    class UnmountDrive:
        def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
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
