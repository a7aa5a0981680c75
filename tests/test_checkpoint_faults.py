"""Training never dies because storage failed: ``fit`` saving into a real FUSE mount that
fails as Drive's does (tests/faultfs.py), and into a disk that is really full."""

from __future__ import annotations

import contextlib
import errno
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import At, differences
from faultfs import CHANGING, FaultyMount
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from waiting import wait_for

from ipycloud.runtime.checkpoint import CheckpointManager, CheckpointWarning, manager_for
from ipycloud.runtime.checkpoint.resilient import resilient_saver
from ipycloud.runtime.durable import make_folder
from ipycloud.runtime.per_process import reset_process_state
from ipycloud.runtime.train.loop import fit

STEPS_PER_EPOCH, EPOCHS = 8, 3


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(16 * STEPS_PER_EPOCH, 6, generator=generator)
    return DataLoader(TensorDataset(inputs, inputs[:, :3].argmax(dim=1)), batch_size=16,
                      shuffle=True)


def train(folder: Path | None, **options: Any) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history = fit(model, optimizer, data(), epochs=EPOCHS, checkpoint=folder,
                  checkpoint_every_steps=4, device="cpu", seed=3, **{"progress": False, **options})
    return model, history


def told(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(warning.message) for warning in caught
            if issubclass(warning.category, CheckpointWarning)]


FAULTS = {
    "ENOTCONN": lambda mount: mount.fail(errno.ENOTCONN),
    "EIO": lambda mount: mount.fail(errno.EIO, ops=["create", "write", "fsync"]),
    "ENOSPC": lambda mount: mount.fail(errno.ENOSPC, ops=["write"]),
    "EROFS": lambda mount: mount.fail(errno.EROFS, ops=CHANGING),
    "vanished": lambda mount: mount.vanish(),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_folder_failing_mid_run_never_ends_it_and_gets_the_newest_back(
        faulty_mount: FaultyMount, fault: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = faulty_mount.path / "checkpoints"
    whole, _ = train(None)
    heal = faulty_mount.come_back if fault == "vanished" else faulty_mount.heal
    saver = resilient_saver(manager_for(folder))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = train(folder, progress=True, callbacks=[At({
            5: lambda: FAULTS[fault](faulty_mount), 14: heal,
            17: lambda: wait_for(lambda: not saver.on_fallback, what="the copy back")})])
    messages = told(caught)
    assert differences(model.state_dict(), whole.state_dict()) == []  # it trained on
    assert len(messages) == 3, messages  # the failure once, the move, and the way back
    first, moved, back = messages
    assert first.startswith(f"ipycloud: saving into {folder} failed: ")
    assert "step 8 is saved in " in first and "ipycloud-fallback" in first
    assert moved.startswith(f"ipycloud: {folder} failed 2 saves in a row; step 12 is saved")
    assert "later saves go there until" in moved
    # 12 if the copy of 12 started only once the mount was healed (step 14), else 16
    assert re.fullmatch(rf"ipycloud: {re.escape(str(folder))} answers again: step (12|16) is "
                        "copied back into it, and checkpoints go there again", back)
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line == f"ipycloud.fit: the newest checkpoint is step 24, in {folder}"
    steps = [info.step for info in CheckpointManager(folder, fallback=None).list()]
    # The folder took the saves from 20 on (24, the epoch's last step, saved once, at its
    # end); before them 16, or 12 when 20 landed before a copy of 16 began (16 then stays
    # in the fallback folder only: the folder already holds newer).
    assert steps[1:] == [20, 24] and steps[0] in (12, 16), steps
    restored = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    assert manager_for(folder).load({"model": restored}, strict=False).step == 24
    assert differences(restored.state_dict(), whole.state_dict()) == []


def test_a_folder_that_never_answers_leaves_the_newest_on_this_machine(
        faulty_mount: FaultyMount, capsys: pytest.CaptureFixture[str]) -> None:
    folder = faulty_mount.path / "checkpoints"
    faulty_mount.fail(errno.EROFS, ops=CHANGING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(folder, progress=True)
    assert [text.split("; ")[-1] for text in told(caught)] == [
        f"step 4 is saved in {manager_for(folder).fallback} instead, and training goes on "
        f"({folder} is tried again at the next save)",
        f"step 8 is saved in {manager_for(folder).fallback} instead, and training goes on: "
        f"later saves go there until {folder} answers again (tried after each save)"]
    fallback = manager_for(folder).fallback
    assert fallback is not None
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith(f"ipycloud.fit: the newest checkpoint is step 24, in "
                                f"{fallback} on this machine only: {folder} did not take it")
    assert [info.step for info in CheckpointManager(fallback, fallback=None).list()] == [
        16, 20, 24]
    # Rerun with the folder still read-only: it resumes from the newest, wherever it is.
    _, again = train(folder, progress=True)
    assert "already complete at step 24" in capsys.readouterr().out
    assert again.steps[-1]["step"] == 24


def test_a_rerun_of_a_finished_run_copies_its_newest_back_once_the_folder_answers(
        faulty_mount: FaultyMount, capsys: pytest.CaptureFixture[str]) -> None:
    """The run ended with the folder failing; the kernel restarts, the folder answers
    again, and the cell is rerun: the run is complete, and its newest checkpoint, on this
    machine only, goes to the folder (no later save would take it there)."""
    folder = faulty_mount.path / "checkpoints"
    faulty_mount.fail(errno.EROFS, ops=CHANGING)
    with pytest.warns(CheckpointWarning):
        train(folder)
    faulty_mount.heal()
    reset_process_state()  # a new kernel
    with pytest.warns(CheckpointWarning, match=rf"{re.escape(str(folder))} answers again: "
                                               "step 24 is copied back"):
        _, history = train(folder, progress=True)
    assert history.steps[-1]["step"] == 24
    lines = capsys.readouterr().out.strip().splitlines()
    assert "already complete at step 24" in lines[-2]
    assert lines[-1] == f"ipycloud.fit: the newest checkpoint is step 24, in {folder}"
    fallback = manager_for(folder).fallback
    assert fallback is not None
    newest = CheckpointManager(fallback, fallback=None).list()[-1]
    copied = CheckpointManager(folder, fallback=None).list()
    assert [(info.step, info.time) for info in copied] == [(24, newest.time)]


def test_a_rerun_resumes_from_the_fallback_when_it_holds_the_newest(
        faulty_mount: FaultyMount) -> None:
    folder = faulty_mount.path / "checkpoints"
    whole, _ = train(None)
    with pytest.warns(CheckpointWarning), pytest.raises(KeyboardInterrupt):
        train(folder, callbacks=[At({6: lambda: faulty_mount.fail(errno.ENOSPC, ops="write"),
                                     18: _interrupt})])
    faulty_mount.heal()
    with pytest.warns(CheckpointWarning, match=f"{re.escape(str(folder))} answers again"):
        resumed, history = train(folder)  # from 16, saved in the fallback folder
    assert differences(resumed.state_dict(), whole.state_dict()) == []
    assert history.steps[-1]["step"] == 24


def _interrupt() -> None:
    raise KeyboardInterrupt  # as a second Ctrl-C stops at once, without saving


def test_a_failure_is_told_once_though_a_background_save_met_it_first(
        faulty_mount: FaultyMount) -> None:
    """The mount drops while a save is written in the background: the next save hears of
    that failure, then meets the same one itself; the user is told once."""
    folder = faulty_mount.path / "checkpoints"
    saver = resilient_saver(CheckpointManager(folder))
    state = {"model": nn.Linear(6, 3)}
    saver.save(state, 1)
    faulty_mount.fail(errno.ENOTCONN, ops="write")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saver.save(state, 2, blocking=False)  # fails in the background
        saver.wait()  # the failure of step 2 is told here
        faulty_mount.fail(errno.ENOTCONN)  # the whole mount now
        saver.save(state, 3, blocking=False)  # fails at once: moves to the fallback folder
    failures = [text for text in told(caught) if " failed: " in text]
    assert len(failures) == 1, told(caught)
    assert "Transport endpoint is not connected" in failures[0]
    assert saver.on_fallback and saver.newest is not None and saver.newest.step == 3


@pytest.mark.parametrize("inside", ["checkpoints", "MyDrive/checkpoints"])
def test_a_save_while_the_mount_is_away_leaves_the_bare_mount_point_alone(
        faulty_mount: FaultyMount, inside: str) -> None:
    """Between a mount's end and its return (Drive mounted again), the mount point is a
    bare folder of the disk below: a save then goes to the fallback folder rather than make
    the folder there, where the mount would hide it (and Drive refuses to mount over it)."""
    folder = faulty_mount.path / inside
    saver = resilient_saver(CheckpointManager(folder))
    state = {"model": nn.Linear(6, 3)}
    saver.save(state, 1)
    faulty_mount.unmount()
    with pytest.warns(CheckpointWarning, match="No such file or directory"):
        info = saver.save(state, 2)
    assert list(faulty_mount.path.iterdir()) == []
    assert info is not None and info.directory == saver.manager.fallback
    faulty_mount.come_back()  # FUSE refuses to mount over files
    assert [info.step for info in CheckpointManager(folder, fallback=None).list()] == [1]


def test_a_first_save_while_the_mount_is_away_leaves_the_bare_mount_point_alone(
        faulty_mount: FaultyMount) -> None:
    """The manager was made while the mount was there; its first save comes after the
    mount went away."""
    folder = faulty_mount.path / "MyDrive" / "checkpoints"
    saver = resilient_saver(CheckpointManager(folder))
    faulty_mount.unmount()
    with pytest.warns(CheckpointWarning, match="no longer mounted"):
        info = saver.save({"model": nn.Linear(6, 3)}, 1)
    assert list(faulty_mount.path.iterdir()) == []
    assert info is not None and info.directory == saver.manager.fallback


def test_a_manager_made_before_its_mount_saves_into_the_mount_once_it_is_there(
        faulty_mount: FaultyMount) -> None:
    """As a notebook that names a folder on Drive before it mounts Drive."""
    folder = faulty_mount.path / "MyDrive" / "checkpoints"
    faulty_mount.unmount()
    manager = CheckpointManager(folder, fallback=None)
    faulty_mount.come_back()
    manager.save({"model": nn.Linear(6, 3)}, 1)
    assert (faulty_mount.backing / "MyDrive" / "checkpoints").is_dir()


def test_a_folder_removed_from_a_disk_that_is_still_there_is_made_again(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "runs" / "checkpoints", fallback=None)
    state = {"model": nn.Linear(6, 3)}
    manager.save(state, 1)
    shutil.rmtree(tmp_path / "runs")
    assert manager.save(state, 2).directory == tmp_path / "runs" / "checkpoints"


def test_once_a_copy_back_lands_saves_go_to_the_folder_while_a_newer_one_is_copied(
        faulty_mount: FaultyMount) -> None:
    """Saves come faster than copies back through a slow mount: the folder answers once the
    first copy lands, and the next save goes there, so that the folder is never more than
    one checkpoint behind (rather than chase each newer one in the fallback folder)."""
    folder = faulty_mount.path / "checkpoints"
    saver = resilient_saver(CheckpointManager(folder))
    state = {"model": nn.Linear(6, 3)}
    saver.save(state, 1)
    faulty_mount.fail(errno.ENOTCONN)
    with pytest.warns(CheckpointWarning):
        saver.save(state, 2)
        saver.save(state, 3)  # two failures in a row: saves go to the fallback folder
        saver.finish()  # waits for the copy back of 3, which fails
    faulty_mount.heal()
    faulty_mount.slow(0.2)  # each write through the mount
    with pytest.warns(CheckpointWarning, match="answers again"):
        saver.save(state, 4)  # to the fallback folder, then copied back
        saver.save(state, 5)  # while 4 is copied
        wait_for(lambda: not saver.on_fallback, timeout=30, what="the folder to answer")
        copied = [info.step for info in CheckpointManager(folder, fallback=None).list()]
        assert copied == [1, 4]  # 5 is still being copied
        info = saver.save(state, 6)
        assert info is not None and info.directory == folder
        saver.finish()


SAVE_ONCE = """
import sys
from torch import nn
from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.checkpoint.resilient import resilient_saver
info = resilient_saver(CheckpointManager(sys.argv[1])).save({"model": nn.Linear(6, 3)}, 1)
print(info.directory)
"""


def test_a_mount_failing_to_read_a_file_back_fails_the_save_not_the_process(
        faulty_mount: FaultyMount) -> None:
    """Every save reads its file back to checksum what the disk holds. Where the mount
    fails that read (EIO), the save fails and goes to the fallback folder; a read through
    a memory map would end the process with SIGBUS (so the save runs in a process of its
    own)."""
    folder = faulty_mount.path / "checkpoints"
    faulty_mount.fail(errno.EIO, ops="read")
    done = subprocess.run([sys.executable, "-c", SAVE_ONCE, str(folder)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-2000:]}"
    assert f"saving into {folder} failed: " in done.stderr
    assert "Input/output error" in done.stderr
    assert done.stdout.strip() == str(manager_for(folder).fallback)


def test_a_run_that_saves_nowhere_is_an_error_after_training(
        faulty_mount: FaultyMount, scratch: Path) -> None:
    (scratch / "ipycloud-fallback").write_text("a file where the fallback folder goes")
    faulty_mount.fail(errno.EROFS, ops=CHANGING)
    with pytest.warns(CheckpointWarning, match="could not be saved in .* either"), \
            pytest.raises(Exception, match="no checkpoint of this run could be saved") as caught:
        train(faulty_mount.path / "checkpoints")
    assert "the trained model is only in memory" in str(caught.value)


def test_a_folder_that_cannot_be_read_at_the_start_trains_nothing(
        faulty_mount: FaultyMount) -> None:
    folder = faulty_mount.path / "checkpoints"
    train(folder)
    faulty_mount.vanish()
    seen: list[int] = []
    with pytest.raises(Exception, match=r"cannot read the folder .*Transport endpoint is not "
                                        r"connected: nothing was trained") as caught:
        train(folder, callbacks=[At({1: lambda: seen.append(1)})])
    assert "\n" not in str(caught.value) and seen == []


def fill(disk: Path) -> None:
    """Write zeros to ``disk`` until it is really full."""
    with open(disk / "filler", "wb") as filler, contextlib.suppress(OSError):
        while True:
            filler.write(bytes(1 << 16))
            filler.flush()


def test_a_really_full_disk_sends_saves_to_the_fallback_and_back(
        small_tmpfs: Callable[..., Path]) -> None:
    disk = small_tmpfs("1m")
    folder = disk / "checkpoints"
    whole, _ = train(None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = train(folder, callbacks=[At({5: lambda: fill(disk),
                                                14: (disk / "filler").unlink})])
    messages = told(caught)
    assert next(text for text in messages if "failed:" in text).count("No space left") == 1
    assert any(f"{folder} answers again" in text for text in messages)
    assert differences(model.state_dict(), whole.state_dict()) == []
    restored = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    assert manager_for(folder).load({"model": restored}, strict=False).directory == folder
    assert differences(restored.state_dict(), whole.state_dict()) == []


def test_a_copy_back_is_told_as_soon_as_it_is_committed(tmp_path: Path) -> None:
    """The saver sends its next save to the folder from the moment the copy's manifest is
    written, not after the rotation that follows (saves meanwhile would leave the folder
    two behind)."""
    state = {"model": nn.Linear(6, 3)}
    manager = CheckpointManager(tmp_path / "folder", keep_last=1, fallback=None)
    manager.save(state, 1)
    copied = CheckpointManager(tmp_path / "fallback", fallback=None).save(state, 3)
    seen: list[list[str]] = []
    manager.copy_in(copied, committed=lambda copy: seen.append(
        sorted(path.name for path in copy.directory.glob("step-*.json"))))
    assert seen == [["step-000000001.json", "step-000000003.json"]]
    assert [info.step for info in manager.list()] == [3]


def test_a_lost_connection_at_the_mount_point_is_told_as_such(faulty_mount: FaultyMount,
                                                              tmp_path: Path) -> None:
    """Whether the folder's file system is still mounted is read at its mount point: a
    mount whose connection dropped answers that with ENOTCONN, not "no longer mounted"."""
    faulty_mount.vanish()
    with pytest.raises(OSError) as raised:
        make_folder(tmp_path / "elsewhere" / "checkpoints", faulty_mount.path)
    assert raised.value.errno == errno.ENOTCONN
    assert not (tmp_path / "elsewhere").exists()


def test_a_copy_back_never_lands_over_a_newer_save_of_its_run(tmp_path: Path) -> None:
    """Once the folder answers, saves go there while an older checkpoint may still be on
    its way back: that copy would be the newest by order, and rotation would remove the
    newer save."""
    state = {"model": nn.Linear(6, 3)}
    older = CheckpointManager(tmp_path / "fallback", fallback=None).save(state, 16)
    manager = CheckpointManager(tmp_path / "folder", keep_last=1, fallback=None)
    manager.save(state, 20)
    assert manager.copy_in(older) is None
    assert [info.step for info in manager.list()] == [20]
