"""The run record ``fit`` writes: what it holds, how each way of ending reads back, and that
storage failing never harms the training."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import At, differences
from faultfs import FaultyMount
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from waiting import wait_for

import ipycloud
from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.per_process import reset_process_state
from ipycloud.runtime.runs import RunRecordWarning, RunSummary, appender, read_run, records
from ipycloud.runtime.runs.appender import Appender
from ipycloud.runtime.runs.records import RECORD_FOLDER, read_records
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.early_stopping import EarlyStopping
from ipycloud.runtime.train.loop import fit

STEPS_PER_EPOCH = 8


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(8 * STEPS_PER_EPOCH, 6, generator=generator)
    return DataLoader(TensorDataset(inputs, inputs[:, :3].argmax(dim=1)), batch_size=8)


def train(checkpoint: Any = None, lr: float = 0.1, **options: Any) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    history = fit(model, torch.optim.SGD(model.parameters(), lr=lr), data(),
                  **{"epochs": 2, "device": "cpu", "progress": False, "seed": 3,
                     "checkpoint": checkpoint, **options})
    return model, history


def ended(folder: Path) -> RunSummary:
    """The one run of ``folder`` once its end is written."""
    log = wait_for(lambda: next((folder / RECORD_FOLDER).glob("*.jsonl"), None),
                   what="the run's log")
    wait_for(lambda: read_records(log)[-1]["kind"] == "end", what="the run's end")
    [run] = ipycloud.runs(folder)
    return run


def test_a_finished_run_records_what_fit_did(tmp_path: Path, state_home: Path) -> None:
    folder = tmp_path / "run 'one'"
    manager = CheckpointManager(folder, keep_best=("val_loss", "min"))
    _, history = train(manager, val_data=data(), log_every=4)

    run = ended(folder)
    [start] = [line for line in read_records(run.log) if line["kind"] == "start"]
    manifests = sorted(folder.glob("step-*.json"))
    assert run.id == start["run"]
    assert {json.loads(path.read_text())["run"] for path in manifests} == {run.id}
    assert (start["pid"], start["folder"], start["step"], start["total_steps"],
            start["epochs"]) == (os.getpid(), str(folder), 0, 16, 2)
    assert (start["model"], start["parameters"], start["optimizer"], start["batch_size"],
            start["grad_accum"], start["world_size"]) == ("Sequential", 163, "SGD", 8, 1, 1)
    assert start["versions"] == {"ipycloud": ipycloud.__version__, "torch": torch.__version__}
    assert [(row["step"], row["loss"]) for row in run.steps] == [
        (row["step"], row["loss"]) for row in history.steps]
    assert all(row["samples_per_s"] == pytest.approx(8 * row["steps_per_s"])
               for row in run.steps)
    assert [{key: value for key, value in logs.items() if key not in ("t", "kind")}
            for logs in run.epochs] == history.epochs
    assert [checkpoint["name"] for checkpoint in run.checkpoints] == [
        path.stem for path in manifests]
    best = min(history.epochs, key=lambda logs: logs["val_loss"])
    assert run.best == {"metric": "val_loss", "value": best["val_loss"], "epoch": best["epoch"]}
    assert (run.status, run.step, run.epoch, run.events, run.reason) == (
        "finished", 16, 2, [], None)
    summary = run.to_json()
    assert (summary["id"], summary["status"], summary["folder"], summary["epochs"],
            summary["checkpoints"], summary["events"]) == (
        run.id, "finished", str(folder), 2, len(manifests), 0)

    entry = json.loads((state_home / "runs" / "index" / f"{run.id}.json").read_text())
    assert (entry["log"], entry["pid"]) == (str(run.log), os.getpid())
    assert [listed.id for listed in ipycloud.runs()] == [run.id]


def test_a_rerun_continues_the_record_with_a_second_start(tmp_path: Path) -> None:
    train(tmp_path, epochs=1)
    ended(tmp_path)
    _, history = train(tmp_path, epochs=2)

    run, lines = read_run(ended(tmp_path).log)
    assert [line["step"] for line in lines if line["kind"] == "start"] == [0, STEPS_PER_EPOCH]
    assert [line["status"] for line in lines if line["kind"] == "end"] == ["finished"] * 2
    assert [(event["event"], event["message"]) for event in run.events] == [
        ("resume", f"resuming from step-{STEPS_PER_EPOCH:09d} (step 8, epoch 1)")]
    assert [row["step"] for row in run.steps] == [row["step"] for row in history.steps]
    assert [line["name"] for line in lines if line["kind"] == "checkpoint"] == [
        f"step-{STEPS_PER_EPOCH:09d}", f"step-{2 * STEPS_PER_EPOCH:09d}"]  # each once
    assert (run.status, run.step) == ("finished", 2 * STEPS_PER_EPOCH)


def failing_loss(outputs: Any, targets: Any) -> Any:
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(the rest)")


@pytest.mark.parametrize(("options", "error", "status", "events", "reason"), [
    ({"lr": 0.0, "val_data": data(), "callbacks": [EarlyStopping("val_loss", patience=1)]},
     None, "stopped early",
     ["early_stop"], "early stop: val_loss has not improved for 1 epoch since epoch 0"),
    ({"loss_fn": failing_loss}, RuntimeError, "failed", ["out_of_memory"],
     "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ({"callbacks": [At({3: lambda: os.kill(os.getpid(), signal.SIGINT)})]}, KeyboardInterrupt,
     "paused", ["pause"],
     "FitInterrupted: ipycloud.fit: interrupted at step 3; rerun this cell to continue"),
], ids=["stopped early", "out of memory", "interrupted"])
def test_each_way_a_run_ends_reads_back_as_its_status(
        tmp_path: Path, options: dict[str, Any], error: type[BaseException] | None,
        status: str, events: list[str], reason: str) -> None:
    if error is None:
        train(tmp_path, **options)
    else:
        with pytest.raises(error):
            train(tmp_path, **options)

    run = ended(tmp_path)
    assert run.status == status
    assert [event["event"] for event in run.events] == events
    assert run.reason is not None and run.reason.startswith(reason)
    if status == "stopped early":
        assert run.best is not None and (run.best["metric"], run.best["epoch"]) == ("val_loss", 0)


def test_a_run_reads_as_running_while_its_process_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")  # 12 h sessions
    seen: list[RunSummary] = []

    class Look(Callback):
        def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
            log = wait_for(lambda: next((tmp_path / RECORD_FOLDER).glob("*.jsonl"), None),
                           what="the run's log")
            wait_for(lambda: read_records(log)[-1]["kind"] == "epoch", what="the epoch")
            seen.extend(ipycloud.runs(tmp_path))

    train(tmp_path, epochs=3, log_every=2, callbacks=[Look()])

    running = seen[0]
    assert (running.status, running.step, running.epoch, running.total_steps) == (
        "running", STEPS_PER_EPOCH, 1, 3 * STEPS_PER_EPOCH)
    assert running.steps_per_s is not None and running.eta_s is not None
    assert running.eta_s == pytest.approx(2 * STEPS_PER_EPOCH / running.steps_per_s)
    assert running.session_left_s is not None and 11 * 3600 < running.session_left_s < 12 * 3600
    assert running.start["platform"] == "Kaggle"
    assert ended(tmp_path).status == "finished"


def test_a_run_without_a_checkpoint_folder_is_recorded_in_the_state_folder(
        state_home: Path) -> None:
    train(None, epochs=1)

    [run] = wait_for(lambda: [run for run in ipycloud.runs() if run.status == "finished"],
                     what="the finished run")
    assert run.log.parent == state_home / "runs" and run.start["folder"] is None
    assert run.step == STEPS_PER_EPOCH


def told(caught: list[warnings.WarningMessage], category: type[Warning]) -> list[str]:
    return [str(warning.message) for warning in caught
            if issubclass(warning.category, category)]


def test_a_record_that_cannot_be_written_leaves_the_training_unharmed(tmp_path: Path) -> None:
    whole, whole_history = train(tmp_path / "clean", log_every=1)
    folder = tmp_path / "blocked"
    folder.mkdir()
    (folder / RECORD_FOLDER).write_text("a file where the record's folder goes")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, history = train(folder, log_every=1)

    assert differences(model.state_dict(), whole.state_dict()) == []
    assert history.steps == whole_history.steps
    assert told(caught, RuntimeWarning) == []  # the recorder followed the run to its end
    [warning] = told(caught, RunRecordWarning)
    assert warning.startswith(f"ipycloud.fit: the run's record cannot be written to {folder}")
    assert "training goes on" in warning
    assert CheckpointManager(folder).latest() is not None


def test_lines_kept_while_the_storage_fails_are_written_once_it_answers(
        faulty_mount: FaultyMount, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(appender, "RETRY_S", 0.05)
    folder = faulty_mount.path / "checkpoints"
    whole, _ = train(None, log_every=1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = train(folder, log_every=1, checkpoint_every_steps=4, callbacks=[At({
            3: lambda: faulty_mount.fail(errno.EIO, ops=["create", "write", "fsync"]),
            12: faulty_mount.heal})])

    assert differences(model.state_dict(), whole.state_dict()) == []
    # told once at most (whether the record's thread met the failure depends on when it ran)
    assert len(told(caught, RunRecordWarning)) <= 1
    run = ended(folder)
    assert [row["step"] for row in run.steps] == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert [event["event"] for event in run.events] == ["fallback", "fallback", "copied_back"]
    assert run.status == "finished"


def appended_through(record: Appender, line: dict[str, int]) -> None:
    """Queue ``line`` and wait until ``record``'s thread tried to write it (a task runs once
    the lines before it are written or kept)."""
    tried = threading.Event()
    record.append(line)
    record.call(tried.set)
    assert tried.wait(10), "the record's thread never tried"


@pytest.mark.parametrize("away", ["unmounted", "dead, then unmounted"])
def test_a_record_leaves_the_bare_mount_point_alone_until_its_mount_returns(
        faulty_mount: FaultyMount, monkeypatch: pytest.MonkeyPatch, away: str) -> None:
    """A run's record begun while Drive was mounted, first written once the mount went
    away: nothing may be made in the bare folder left below it (the returning mount would
    hide it, and FUSE refuses to mount over it). A mount that died first (ENOTCONN) is still
    known for the mount it was once it is only a bare folder."""
    monkeypatch.setattr(appender, "RETRY_S", 0.05)
    (faulty_mount.path / "checkpoints").mkdir()
    log = faulty_mount.path / "checkpoints" / RECORD_FOLDER / "run.jsonl"
    if away == "unmounted":
        record = Appender(log, records.encode)
        faulty_mount.unmount()
    else:
        faulty_mount.vanish()
        record = Appender(log, records.encode)
        appended_through(record, {"step": 0})
        faulty_mount.unmount()
    appended_through(record, {"step": 1})
    assert list(faulty_mount.path.iterdir()) == [], "written into the bare mount point"
    faulty_mount.come_back()
    written = faulty_mount.backing / "checkpoints" / RECORD_FOLDER / "run.jsonl"
    wait_for(lambda: written.exists() and written.read_text().endswith('{"step":1}\n'),
             what="the lines once the mount is back")
    record.close()


def test_the_start_names_the_jupyter_kernel_and_its_notebook(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    connection = "/root/.local/share/jupyter/runtime/kernel-4f6c1e2a-77b1-4c1b-9d8e-1f.json"
    monkeypatch.setattr(sys, "argv", ["/usr/lib/ipykernel_launcher.py", "-f", connection])
    monkeypatch.setenv("JPY_SESSION_NAME", "/content/my runs/train 'a'.ipynb")
    train(tmp_path, epochs=1)

    run = ended(tmp_path)
    assert (run.start["kernel"], run.start["notebook"]) == ("4f6c1e2a-77b1-4c1b-9d8e-1f",
                                                            "train 'a'.ipynb")
    assert run.to_json()["kernel"] == "4f6c1e2a-77b1-4c1b-9d8e-1f"


def test_a_script_outside_jupyter_is_named_as_the_notebook(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/home/me/train.py", "--lr", "0.1"])
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    train(tmp_path, epochs=1)

    run = ended(tmp_path)
    assert (run.start["kernel"], run.start["notebook"]) == (None, "train.py")


def test_a_relative_folder_is_recorded_as_an_absolute_one(
        tmp_path: Path, state_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    train("runs/exp 1", epochs=1)

    run = ended(Path("runs/exp 1"))
    assert run.start["folder"] == run.checkpoints[-1]["folder"] == str(tmp_path / "runs" / "exp 1")
    assert run.log == tmp_path / "runs" / "exp 1" / RECORD_FOLDER / f"{run.id}.jsonl"
    entry = json.loads((state_home / "runs" / "index" / f"{run.id}.json").read_text())
    monkeypatch.chdir(state_home)  # as a server started elsewhere reads the index
    assert entry["log"] == str(run.log) and [found.id for found in ipycloud.runs()] == [run.id]


def test_a_checkpoint_written_in_the_background_is_recorded_before_the_next_save(
        tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_best=("val_loss", "min"), background="thread")
    # each epoch's end saves in the background; by step 12 the save of step 8 is written,
    # and the next save is at step 16
    train(manager, val_data=data(), log_every=1, checkpoint_every="1h",
          callbacks=[At({12: lambda: wait_for(lambda: not manager.writing, what="the save")})])

    lines = read_records(ended(tmp_path).log)
    kinds = [(line["kind"], line.get("step")) for line in lines
             if line["kind"] in ("step", "checkpoint")]
    # told at the first row after it is written (at step 13 at the latest), not at step 16
    assert kinds.index(("step", 9)) <= kinds.index(("checkpoint", 8)) <= kinds.index(("step", 14))



def test_a_runs_start_and_its_checkpoints_are_written_at_once_for_a_kill_loses_them_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(appender, "WRITE_EVERY_S", 3600.0)  # no timed round during the run

    def kinds() -> list[str]:
        log = next((tmp_path / RECORD_FOLDER).glob("*.jsonl"), None)
        return [] if log is None else [line["kind"] for line in read_records(log)]

    # saves at steps 2 and 4, each written before the next begins: step 2's is told by
    # step 5; a process killed at step 1 or 6 leaves the run on record, with a checkpoint
    train(tmp_path, epochs=1, checkpoint_every_steps=2, callbacks=[At({
        1: lambda: wait_for(lambda: "start" in kinds(), what="the start line"),
        6: lambda: wait_for(lambda: "checkpoint" in kinds(), what="a checkpoint line")})])


RUN_ID_OF_ANOTHER_PROCESS = """
import sys
from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.per_process import reset_process_state
print(CheckpointManager(sys.argv[1]).run_id())
"""


def another_process_run_id(folder: Path) -> str:
    return subprocess.run([sys.executable, "-c", RUN_ID_OF_ANOTHER_PROCESS, str(folder)],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_run_is_claimed_as_it_starts_so_another_process_takes_a_run_of_its_own(
        tmp_path: Path) -> None:
    train(tmp_path, epochs=1)
    first = ended(tmp_path)
    for lease in tmp_path.glob(".ipycloud-run-*.json"):  # as though its process were gone
        lease.unlink()
    reset_process_state()
    seen: list[str] = []
    # the rerun goes on with the run; before its first save, another process looks
    train(tmp_path, epochs=2, callbacks=[At({9: lambda: seen.append(
        another_process_run_id(tmp_path))})])

    [run] = ipycloud.runs(tmp_path)
    assert run.id == first.id and [line["step"] for line in read_records(run.log)
                                   if line["kind"] == "start"] == [0, STEPS_PER_EPOCH]
    assert seen and seen[0] != run.id
