"""CheckpointManager with real torch objects on the CPU and real files in a temporary folder."""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from checkpoint_helpers import differences, in_child
from torch import nn
from waiting import wait_for

from ipycloud.runtime.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    CheckpointManager,
    CheckpointWarning,
    background_saves,
    catalog,
    manager_for,
    writer_process,
)
from ipycloud.runtime.checkpoint.background import background_pays_off, tensor_devices
from ipycloud.runtime.durable import folder_lock
from ipycloud.runtime.machine import platform


def build(seed: int) -> dict[str, Any]:
    """A model with buffers, AdamW, a step LR schedule and a CPU GradScaler."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** (seed + 4), growth_interval=2)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}


def train(parts: dict[str, Any], steps: int) -> None:
    """A few real optimisation steps, so every object has non-trivial state."""
    model, optimizer = parts["model"], parts["optimizer"]
    for _ in range(steps):
        inputs = torch.randn(32, 8)
        loss = nn.functional.mse_loss(model(inputs), inputs[:, :2] * 3.0)
        optimizer.zero_grad()
        parts["scaler"].scale(loss).backward()
        parts["scaler"].step(optimizer)
        parts["scaler"].update()
        parts["scheduler"].step()


def snapshot(parts: dict[str, Any]) -> dict[str, Any]:
    """Deep copies of every object's state_dict()."""
    return {name: copy.deepcopy(obj.state_dict()) for name, obj in parts.items()}


def checkpoint_files(folder: Path) -> list[str]:
    """Names of the checkpoint files (data and manifests) in the folder."""
    return sorted(path.name for path in folder.glob("step-*"))


def steps_of(manager: CheckpointManager) -> list[int]:
    """The steps of the listed checkpoints, oldest first."""
    return [info.step for info in manager.list()]


# -- round trip -------------------------------------------------------------------------------

def test_round_trip_restores_every_kind_of_object(tmp_path: Path) -> None:
    parts = build(seed=0)
    train(parts, 5)
    tensor = torch.arange(12.0).reshape(3, 4)
    generator = torch.Generator().manual_seed(11)
    torch.rand(5, generator=generator)
    state = {**parts, "tensor": tensor, "shuffle": generator, "epoch": 4,
             "history": [0.5, 0.25], "config": {"name": "warm", "layers": (8, 16)}}
    expected = snapshot(parts)
    assert expected["scaler"]["scale"] != 2.0 ** 4  # the scaler really moved
    assert expected["scheduler"]["last_epoch"] == 5
    manager = CheckpointManager(tmp_path / "run")
    info = manager.save(state, step=5)
    assert info is not None and info.step == 5
    next_draw = torch.rand(5, generator=generator)

    fresh = build(seed=9)
    train(fresh, 1)
    assert differences(snapshot(fresh)["model"], expected["model"])
    fresh_tensor = torch.zeros(3, 4)
    fresh_generator = torch.Generator().manual_seed(99)
    restored: dict[str, Any] = {**fresh, "tensor": fresh_tensor, "shuffle": fresh_generator,
                                "epoch": None, "history": None, "config": None}
    assert manager.load(restored).name == info.name

    assert differences(snapshot(fresh), expected) == []
    assert restored["tensor"] is fresh_tensor  # in place
    assert torch.equal(fresh_tensor, torch.arange(12.0).reshape(3, 4))
    assert restored["shuffle"] is fresh_generator
    assert torch.equal(torch.rand(5, generator=fresh_generator), next_draw)
    assert restored["epoch"] == 4 and restored["history"] == [0.5, 0.25]
    assert restored["config"] == {"name": "warm", "layers": (8, 16)}
    assert fresh["scheduler"].get_last_lr() == parts["scheduler"].get_last_lr()
    assert fresh["scaler"].get_scale() == parts["scaler"].get_scale()


def test_strict_names_what_is_missing_and_non_strict_restores_the_rest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    source = nn.Linear(4, 4)
    manager.save({"model": source}, step=1)
    target = nn.Linear(4, 4)
    before = copy.deepcopy(target.state_dict())
    extra = torch.full((2,), 5.0)
    with pytest.raises(CheckpointError, match=r"no 'ema'.*strict=False"):
        manager.load({"model": target, "ema": extra})
    assert differences(target.state_dict(), before) == []  # nothing half-restored
    manager.load({"model": target, "ema": extra}, strict=False)
    assert differences(target.state_dict(), source.state_dict()) == []
    assert torch.equal(extra, torch.full((2,), 5.0))


# -- rotation ---------------------------------------------------------------------------------

def test_keep_last_keeps_exactly_the_newest(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder, keep_last=3)
    for step in range(1, 8):
        manager.save({"step": step}, step=step)
    assert steps_of(manager) == [5, 6, 7]
    assert checkpoint_files(folder) == [f"step-{step:09d}.{ext}" for step in (5, 6, 7)
                                        for ext in ("json", "pt")]


def test_two_managers_saving_into_one_folder_take_turns_and_keep_both(tmp_path: Path) -> None:
    """The name and sequence number are picked under the folder lock, not before it."""
    tensors = [torch.full((3,), float(index)) for index in range(2)]
    infos: dict[int, Any] = {}

    def save(index: int) -> None:
        manager = CheckpointManager(tmp_path, keep_last=None)
        infos[index] = manager.save({"x": tensors[index]}, step=7)

    threads = [threading.Thread(target=save, args=(index,)) for index in range(2)]
    with folder_lock(tmp_path):  # another writer holds the folder: both saves wait
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(0.25)
        assert all(thread.is_alive() for thread in threads)
    for thread in threads:
        thread.join(10)
    assert sorted(info.name for info in infos.values()) == ["step-000000007",
                                                            "step-000000007.1"]
    assert sorted(info.sequence for info in infos.values()) == [1, 2]
    for index, info in infos.items():
        restored = {"x": torch.zeros(3)}
        CheckpointManager(tmp_path).load(restored, info.name)
        assert torch.equal(restored["x"], tensors[index])


def test_keep_best_keeps_the_best_as_well(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "low", keep_last=2, keep_best=("val_loss", "min"))
    for step, loss in enumerate([0.9, 0.3, 0.5, 0.7, 0.6], start=1):
        manager.save({"step": step}, step=step, metrics={"val_loss": loss})
    assert steps_of(manager) == [2, 4, 5]

    manager = CheckpointManager(tmp_path / "high", keep_last=1, keep_best=("acc", "max", 2))
    for step, accuracy in enumerate([0.1, 0.9, 0.8, 0.2, 0.3, 0.4], start=1):
        manager.save({"step": step}, step=step, metrics={"acc": accuracy})
    assert steps_of(manager) == [2, 3, 6]


def test_tagged_checkpoints_survive_rotation(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep_last=2)
    manager.save({"step": 1}, step=1, tag="warmup")
    for step in range(2, 7):
        manager.save({"step": step}, step=step)
    assert steps_of(manager) == [1, 5, 6]
    state: dict[str, Any] = {"step": None}
    assert manager.load(state, which="warmup").step == 1 and state["step"] == 1


# -- choosing a checkpoint and listing them ---------------------------------------------------

def test_best_loads_the_best_by_the_keep_best_metric(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder, keep_last=2, keep_best=("val_loss", "min"))
    for step, loss in enumerate([0.9, 0.3, 0.5, 0.3, 0.6], start=1):
        manager.save({"step": step}, step=step, metrics={"val_loss": loss, "acc": -loss})
    state: dict[str, Any] = {"step": None}
    # of a tie, the first to reach the value: early stopping counts from it too
    assert manager.load(state, which="best").step == 2 and state["step"] == 2
    assert [info.step for info in manager.list()] == [2, 4, 5]
    by_accuracy = CheckpointManager(folder, keep_best=("acc", "max"))
    assert by_accuracy.load(state, which="best").step == 2
    # the rule the checkpoints were saved with serves a manager without one (%checkpoint's)
    assert manager_for(folder).load(state, which="best").step == 2


def test_a_damaged_best_falls_back_to_the_next_best(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep_last=None, keep_best=("acc", "max"))
    infos = [manager.save({"step": step}, step=step, metrics={"acc": acc})
             for step, acc in ((1, 0.5), (2, 0.9), (3, 0.7))]
    assert infos[1] is not None
    infos[1].data_path.write_bytes(b"not a checkpoint")
    state: dict[str, Any] = {"step": None}
    with pytest.warns(CheckpointWarning, match=r"step-000000002 .* damaged .*the next best"):
        assert manager.load(state, which="best").step == 3


def test_best_without_a_metric_to_rank_by_is_a_one_line_error(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    CheckpointManager(folder).save({"step": 1}, step=1, metrics={"loss": 0.5})
    state: dict[str, Any] = {"step": None}
    with pytest.raises(CheckpointError, match=r"^which='best' needs the metric to rank by: "
                       r"pass best_by=\(metric, 'min' or 'max'\), as no checkpoint in .* was "
                       r"saved with a keep_best rule \(metrics saved: loss\)$"):
        CheckpointManager(folder).load(state, which="best")
    for manager, best_by in ((CheckpointManager(folder, keep_best=("val_loss", "min")), None),
                             (CheckpointManager(folder), ("val_loss", "min"))):
        with pytest.raises(CheckpointError, match=r"^no checkpoint in .* has the metric "
                           r"'val_loss' that 'best' is ranked by \(metrics saved: loss\)$"):
            manager.load(state, which="best", best_by=best_by)
    assert state["step"] is None


def test_best_by_ranks_without_a_keep_best_rule(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder, keep_last=None)
    for step, loss in ((1, 0.5), (2, 0.2), (3, 0.9)):
        manager.save({"step": step}, step=step, metrics={"val_loss": loss})
    state: dict[str, Any] = {"step": None}
    assert manager.load(state, which="best", best_by=("val_loss", "min")).step == 2
    assert state["step"] == 2
    assert manager.load(state, which="best", best_by=("val_loss", "max")).step == 3
    assert state["step"] == 3


@pytest.mark.parametrize("keep_best", [("val_loss",), ("val_loss", "low"),
                                       ("val_loss", "min", 0), ("val_loss", "min", 1, 2),
                                       "val_loss"])
def test_bad_keep_best_is_a_value_error(tmp_path: Path, keep_best: Any) -> None:
    with pytest.raises(ValueError, match=r"^keep_best is \(metric, 'min' or 'max'"):
        CheckpointManager(tmp_path, keep_best=keep_best)


def test_which_step_tag_or_name_and_unknown_ones(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep_last=None)
    manager.save({"step": 10}, step=10)
    named = manager.save({"step": 20}, step=20, tag="good")
    manager.save({"step": 30}, step=30)
    assert named is not None and named.name == "step-000000020-good"
    state: dict[str, Any] = {"step": None}
    assert manager.load(state, which=10).step == 10 and state["step"] == 10
    assert manager.load(state, which="good").step == 20 and state["step"] == 20
    assert manager.load(state, which=named.name).step == 20
    assert manager.load(state).step == 30 and state["step"] == 30
    with pytest.raises(CheckpointError, match=r"step 25 .*steps saved: 10, 20, 30"):
        manager.load(state, which=25)
    with pytest.raises(CheckpointError, match=r"'nope'.*tags: good"):
        manager.load(state, which="nope")
    assert state["step"] == 30


def test_list_is_in_save_order_with_its_fields(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder, keep_last=None)
    started = time.time()
    first = manager.save({"weights": torch.ones(1000)}, step=5, epoch=1,
                         metrics={"loss": 0.5, "acc": torch.tensor(0.75)})
    second = manager.save({"weights": torch.ones(10)}, step=3, tag="retry",
                          data_position={"epoch": 0, "batch": 7})
    finished = time.time()
    listed = manager.list()
    assert [info.name for info in listed] == ["step-000000005", "step-000000003-retry"]
    assert [info.step for info in listed] == [5, 3]  # save order, not step order
    assert [info.tag for info in listed] == [None, "retry"]
    assert listed[0].metrics == {"loss": 0.5, "acc": 0.75} and listed[1].metrics == {}
    assert listed[0].epoch == 1 and listed[1].data_position == {"epoch": 0, "batch": 7}
    for info in listed:
        assert info.size == info.data_path.stat().st_size > 0
        assert started <= info.time <= finished
    assert listed[0].size > listed[1].size
    assert (listed[0], listed[1]) == (first, second)
    assert (folder / "latest").read_text().strip() == "step-000000003-retry"
    assert manager.latest() == second
    assert manager.next_step() == 6


# -- asynchronous saves -----------------------------------------------------------------------

@pytest.fixture(params=["writer process", "thread"])
def background_writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Background saves by the writer process (Linux) or, where there is none, a thread."""
    if request.param == "thread":
        monkeypatch.setattr(writer_process, "supported", lambda: False)
    return str(request.param)


def host_copies(manager: CheckpointManager) -> dict[Any, torch.Tensor]:
    """The host copies a manager's background saves write from, by place in the state."""
    if manager._saves._process is not None:
        return dict(manager._saves._process._buffers._views)
    return dict(manager._saves._buffers._buffers)


def test_async_save_writes_the_values_of_the_moment_of_save(tmp_path: Path,
                                                           background_writer: str) -> None:
    manager = CheckpointManager(tmp_path / "run", keep_last=None)
    model = nn.Linear(1024, 1024)
    at_save = copy.deepcopy(model.state_dict())
    assert manager.save({"model": model}, step=1, blocking=False) is None
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # before the background write can have finished
    info = manager.wait()
    assert info is not None and info.step == 1 and info.data_path.is_file()
    buffers = host_copies(manager)
    assert len(buffers) >= 2
    assert (manager._saves._process is None) == (background_writer == "thread")
    live = {parameter.data_ptr() for parameter in model.parameters()}
    assert not live & {buffer.data_ptr() for buffer in buffers.values()}

    at_second = copy.deepcopy(model.state_dict())
    assert manager.save({"model": model}, step=2, blocking=False) is None
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.0)
    assert manager.wait().step == 2  # type: ignore[union-attr]
    assert {key: id(value) for key, value in host_copies(manager).items()} == {
        key: id(value) for key, value in buffers.items()}  # reused, not reallocated

    restored = nn.Linear(1024, 1024)
    manager.load({"model": restored}, which=1)
    assert differences(restored.state_dict(), at_save) == []
    manager.load({"model": restored}, which=2)
    assert differences(restored.state_dict(), at_second) == []


def test_a_save_in_the_background_is_listed_as_writing(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder, keep_last=3, keep_best=("val_loss", "min"))
    manager.save({"weights": torch.zeros(8)}, step=100, metrics={"val_loss": 1.0})
    with folder_lock(folder):  # the writer waits for the folder: the save stays pending
        assert manager.save({"weights": torch.ones(8)}, step=120, tag="warm", blocking=False,
                            metrics={"val_loss": 0.5}) is None
        listed = manager.list()
        table = str(manager.table())
        described = repr(manager)
        assert manager.writing
    assert [(info.name, info.status) for info in listed] == [
        ("step-000000100", "complete"), ("step-000000120-warm", "writing")]
    assert listed[1].metrics == {"val_loss": 0.5} and listed[1].tag == "warm"
    assert "step-000000100 (latest)" in table and "step-000000120-warm (writing)" in table
    assert described == (f"CheckpointManager({str(folder)!r}, keep_last=3, "
                         "keep_best=('val_loss', 'min', 1), writing step 120)")
    assert manager.wait().name == "step-000000120-warm"  # type: ignore[union-attr]
    assert not manager.writing
    assert [info.status for info in manager.list()] == ["complete", "complete"]
    assert "step-000000120-warm (latest)" in str(manager.table())
    assert repr(manager) == (f"CheckpointManager({str(folder)!r}, keep_last=3, "
                             "keep_best=('val_loss', 'min', 1))")
    assert repr(CheckpointManager(folder, keep_last=None)) == (
        f"CheckpointManager({str(folder)!r}, keep_last=None, keep_best=None)")


def test_a_save_whose_manifest_just_appeared_is_listed_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder)
    committed, resume = threading.Event(), threading.Event()
    write_manifest = catalog.write_manifest

    def pausing_after(info: CheckpointInfo) -> None:
        write_manifest(info)
        if threading.current_thread().name == "ipycloud-checkpoint-writer":
            committed.set()
            resume.wait(30)

    monkeypatch.setattr(catalog, "write_manifest", pausing_after)
    manager.save({"weights": torch.ones(8)}, step=5, blocking=False)
    assert committed.wait(30)  # the manifest is written; the writer has not gone on yet
    listed = [(info.name, info.status) for info in manager.list()]
    resume.set()
    manager.wait()
    assert listed == [("step-000000005", "complete")]


def test_a_copy_committed_meanwhile_leaves_a_background_save_listed_as_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy back (``copy_in``, from the saver's copying thread) commits while a save of
    the manager's own waits for the folder in the background: that save is still being
    written, and is listed so."""
    state = {"model": nn.Linear(6, 3)}
    manager = CheckpointManager(tmp_path / "folder", fallback=None, background="thread")
    copied = CheckpointManager(tmp_path / "fallback", fallback=None).save(state, 3)
    assert copied is not None
    saving = threading.Thread(target=manager.save, args=(state, 4), kwargs={"blocking": False})
    write_manifest = catalog.write_manifest

    def saving_meanwhile(info: CheckpointInfo) -> None:
        if info.step == 3:  # the copy, under the folder's lock: the save waits for it
            saving.start()
            saving.join(30)
        write_manifest(info)

    monkeypatch.setattr(catalog, "write_manifest", saving_meanwhile)
    seen: list[list[tuple[int, str]]] = []
    manager.copy_in(copied, committed=lambda _copy: seen.append(
        [(info.step, info.status) for info in manager.list()]))
    assert seen == [[(3, "complete"), (4, "writing")]]
    assert manager.wait().step == 4  # type: ignore[union-attr]
    assert [(info.step, info.status) for info in manager.list()] == [
        (3, "complete"), (4, "complete")]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs Linux scheduling policies")
def test_the_writer_runs_at_idle_priority_until_someone_waits_for_it(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder)
    manager.save({"weights": torch.zeros(8)}, step=0)
    with folder_lock(folder):  # the writer waits for the folder
        manager.save({"weights": torch.ones(8)}, step=1, blocking=False)
        writer = manager._saves._writer._thread
        assert writer is not None and writer.name == "ipycloud-checkpoint-writer"
        wait_for(lambda: os.sched_getscheduler(writer.native_id) == os.SCHED_IDLE,
                 what="the writer at idle priority")
        waiter = threading.Thread(target=manager.wait)
        waiter.start()
        wait_for(lambda: os.sched_getscheduler(writer.native_id) == os.SCHED_OTHER,
                 what="the waited-for writer at normal priority")
        assert waiter.is_alive() and writer.is_alive()  # still held by the lock
    waiter.join(30)
    assert manager.wait().step == 1  # type: ignore[union-attr]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's own policy is untouched


def test_a_background_save_that_ended_leaves_no_priority_timer_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer that would end a save's idle priority ends with the save (a cell rerun
    over and over would otherwise pile up threads)."""
    monkeypatch.setattr(background_saves, "IDLE_PRIORITY_S", 600.0)
    manager = CheckpointManager(tmp_path / "run")
    manager.save({"weights": torch.ones(8)}, step=1, blocking=False)
    assert manager.wait().step == 1  # type: ignore[union-attr]
    wait_for(lambda: not any(thread.name == background_saves.PRIORITY_TIMER_NAME
                             for thread in threading.enumerate()),
             what="the priority timer's end")


@pytest.fixture
def four_cores(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process may run on four cores; torch's thread count is put back afterwards."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("torch_threads", "in_background"), [(4, False), (3, True), (1, True)])
def test_auto_writes_in_the_background_only_when_training_leaves_a_core(
        tmp_path: Path, four_cores: None, torch_threads: int, in_background: bool) -> None:
    torch.set_num_threads(torch_threads)
    manager = CheckpointManager(tmp_path / "run")
    returned = manager.save({"weights": torch.ones(8)}, step=1, blocking="auto")
    assert (returned is None) is in_background
    assert manager.wait().step == 1  # type: ignore[union-attr]


def writer_processes() -> int:
    """The checkpoint writer processes among this one's children (other tests of the
    session may leave children of their own running beside them)."""
    return sum(1 for child in psutil.Process().children()
               if "writer_child" in " ".join(_command_line(child)))


def _command_line(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # it has ended meanwhile
        return []


@pytest.mark.skipif(not writer_process.supported(), reason="the writer process needs Linux")
@pytest.mark.parametrize(("background", "auto_in_background", "writer"), [
    ("auto", False, "process"), ("never", False, "process"), ("thread", True, "thread"),
    ("process", True, "process")])
def test_background_decides_how_auto_saves_are_written_and_by_whom(
        tmp_path: Path, four_cores: None, background: Any, auto_in_background: bool,
        writer: str) -> None:
    torch.set_num_threads(4)  # every core busy: "auto" alone writes at once
    manager = CheckpointManager(tmp_path / "run", background=background)
    returned = manager.save({"weights": torch.ones(8)}, step=1, blocking="auto")
    assert (returned is None) is auto_in_background
    assert manager.wait().step == 1  # type: ignore[union-attr]
    assert writer_processes() == (writer == "process" and auto_in_background)
    assert manager.save({"weights": torch.ones(8)}, step=2, blocking=False) is None
    assert manager.wait().step == 2  # type: ignore[union-attr]
    assert writer_processes() == (writer == "process")
    saved = manager.save({"weights": torch.ones(8)}, step=3, blocking=True)
    assert saved is not None and saved.step == 3
    manager.close()
    assert [info.step for info in manager.list()] == [1, 2, 3]
    shown = "" if background == "auto" else f", background={background!r}"
    assert repr(manager).endswith(f"keep_best=None{shown})")


@pytest.mark.parametrize("background", ["yes", True, None, "Thread"])
def test_bad_background_is_a_value_error(tmp_path: Path, background: Any) -> None:
    with pytest.raises(ValueError, match=(
            r"^background must be 'auto', 'process', 'thread' or 'never', not "
            + re.escape(repr(background)) + "$")):
        CheckpointManager(tmp_path / "run", background=background)


def test_auto_writes_in_the_background_for_a_state_on_an_accelerator(four_cores: None) -> None:
    torch.set_num_threads(4)
    on_cpu = {"model": {"weight": torch.ones(2)}, "step": 3}
    assert not background_pays_off(tensor_devices(on_cpu))
    assert background_pays_off(tensor_devices(
        {**on_cpu, "moments": [torch.empty(2, device="meta")]}))


@pytest.mark.parametrize("blocking", [1, "yes", None])
def test_blocking_takes_true_false_or_auto(tmp_path: Path, blocking: Any) -> None:
    folder = tmp_path / "run"
    with pytest.raises(ValueError, match="blocking must be True, False or 'auto'"):
        CheckpointManager(folder).save({"x": 1}, step=1, blocking=blocking)
    assert not folder.exists()


def _fail_in_background(folder: str) -> dict[str, Any]:
    """With file size capped, async saves fail in the writer thread; report what surfaced."""
    manager = CheckpointManager(folder, keep_last=None)
    manager.save({"weights": torch.ones(8)}, step=1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    outcome: dict[str, Any] = {}
    big = {"weights": torch.ones(1 << 18)}
    outcome["returned"] = manager.save(big, step=2, blocking=False)
    try:
        manager.wait()
    except CheckpointError as error:
        outcome["wait"] = str(error)
    outcome["listed"] = [(info.step, info.status) for info in manager.list()]
    outcome["wait_again"] = manager.wait().step  # type: ignore[union-attr]
    manager.save(big, step=3, blocking=False)
    try:
        manager.save({"weights": torch.ones(8)}, step=4)
    except CheckpointError as error:
        outcome["save"] = str(error)
    outcome["after"] = manager.save({"weights": torch.ones(8)}, step=5).step  # type: ignore
    return outcome


def test_a_background_failure_surfaces_at_the_next_call(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    outcome = in_child(_fail_in_background, str(folder))
    assert outcome["returned"] is None
    assert outcome["wait"].startswith("the previous asynchronous save failed: could not write")
    assert "could not write step-000000002 in" in outcome["wait"]
    assert outcome["listed"] == [(1, "complete")]  # the failed one is no longer "writing"
    assert outcome["wait_again"] == 1  # raised once, then cleared
    assert outcome["save"].startswith("the previous asynchronous save failed: could not write")
    assert "could not write step-000000003 in" in outcome["save"]
    assert outcome["after"] == 5
    assert steps_of(CheckpointManager(folder)) == [1, 5]
    assert not [path for path in folder.iterdir() if path.name.startswith(".tmp-")]


EXIT_RIGHT_AFTER_ASYNC_SAVE = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from ipycloud.runtime.checkpoint import CheckpointManager

    folder = Path(sys.argv[1])
    manager = CheckpointManager(folder)
    manager.save({"weights": torch.full((16 << 20,), 7.0)}, step=7, blocking=False)
    print("committed at return:", any(folder.glob("step-*.json")))
""")


def test_interpreter_exit_waits_for_an_async_save(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", EXIT_RIGHT_AFTER_ASYNC_SAVE, str(folder)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "committed at return: False"  # the write was pending
    assert result.stderr == ""
    state = {"weights": torch.zeros(16 << 20)}
    info = CheckpointManager(folder).load(state)
    assert info.step == 7 and torch.all(state["weights"] == 7.0)
    assert not [path for path in folder.iterdir() if path.name.startswith(".tmp-")]


# -- refused inputs ---------------------------------------------------------------------------

@pytest.mark.parametrize(("state", "pattern"), [
    ({"thing": object()}, r"state\['thing'\] is a object, which has no state_dict\(\)"),
    ({"array": np.zeros(3)}, r"state\['array'\].*torch\.from_numpy"),
    ({"stats": {"mean": np.zeros(3)}}, r"state\['stats'\]\['mean'\].*torch\.from_numpy"),
    ({"stats": {"best": np.float64(0.5)}}, r"state\['stats'\]\['best'\] is a float64"),
], ids=["object", "numpy-array", "nested-array", "numpy-scalar"])
def test_unsaveable_state_is_refused_before_writing(tmp_path: Path, state: dict[str, Any],
                                                     pattern: str) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder)
    with pytest.raises(CheckpointError, match=pattern):
        manager.save({"model": nn.Linear(2, 2), **state}, step=1)
    assert checkpoint_files(folder) == []


@pytest.mark.parametrize("step", [-1, 1.5, True, "3"])
def test_bad_steps_are_value_errors(tmp_path: Path, step: Any) -> None:
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        CheckpointManager(tmp_path / "run").save({"x": 1}, step=step)


def test_steps_beyond_the_names_nine_digits_are_refused(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    manager.save({"x": 1}, step=999_999_999)
    with pytest.raises(ValueError, match=r"at most 999999999 .*nine digits.*not 1000000000"):
        manager.save({"x": 1}, step=1_000_000_000)
    assert [info.step for info in manager.list()] == [999_999_999]


@pytest.mark.parametrize("epoch", [-3, 1.5, True, "2", 2**53 + 1])
def test_bad_epochs_are_value_errors_and_save_nothing(tmp_path: Path, epoch: Any) -> None:
    """An epoch the manifest's reader would refuse: the checkpoint would never be listed."""
    folder = tmp_path / "run"
    with pytest.raises(ValueError, match=r"^epoch must be a non-negative integer \(at most "
                                         r"2\*\*53\) or None, not "):
        CheckpointManager(folder).save({"x": 1}, step=1, epoch=epoch)
    assert not folder.exists()


def test_the_largest_numbers_a_manifest_keeps_read_back_as_saved(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    manager.save({"x": 1}, step=1, epoch=2**53, data_position={"seed": 2**53, "at": -(2**53)})
    (info,) = manager.list()
    assert (info.epoch, info.data_position) == (2**53, {"seed": 2**53, "at": -(2**53)})


@pytest.mark.parametrize("tag", ["1abc", "latest", "best", "a/b", "", "x" * 65])
def test_bad_tags_are_value_errors(tmp_path: Path, tag: str) -> None:
    with pytest.raises(ValueError, match="invalid tag"):
        CheckpointManager(tmp_path / "run").save({"x": 1}, step=1, tag=tag)


def test_a_nan_or_infinite_metric_is_left_out_of_a_checkpoint_saved_whole(
        tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    info = manager.save({"x": 1}, step=1, metrics={"loss": math.nan, "f1": -math.inf,
                                                   "accuracy": 0.5, "count": 10**400})
    assert info is not None and info.metrics == {"accuracy": 0.5}
    manifest = json.loads(info.manifest_path.read_text(),
                          parse_constant=lambda constant: pytest.fail(constant))
    assert manifest["metrics"] == {"accuracy": 0.5}
    assert [saved.step for saved in manager.list()] == [1]


@pytest.mark.parametrize("position", [{"at": math.nan}, {"seed": 2**53 + 1},
                                      [1, {"nested": [-(2**60)]}]])
def test_a_data_position_that_would_not_read_back_is_refused_and_saves_nothing(
        tmp_path: Path, position: Any) -> None:
    folder = tmp_path / "run"
    with pytest.raises(ValueError, match=r"^data_position must be JSON data \(finite numbers, "
                                         r"integers within 2\*\*53"):
        CheckpointManager(folder).save({"x": 1}, step=1, data_position=position)
    assert not list(folder.glob("step-*"))


def test_loading_from_a_missing_folder_is_a_checkpoint_error(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "never-saved")
    with pytest.raises(CheckpointError, match=r"no checkpoint folder at .*never-saved"):
        manager.load({"x": None})
    with pytest.raises(CheckpointError, match="no checkpoint folder"):
        manager.list()
    assert manager.next_step() == 0


# -- default folder ---------------------------------------------------------------------------

def platform_neutral_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """No platform's variables from the host, and HOME pointed at ``home``."""
    for rule in platform._RULES:
        for name in (*rule.env, *(name for name, _ in rule.env_values)):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))


def test_default_directory_is_under_home_on_a_local_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    platform_neutral_env(monkeypatch, tmp_path)
    assert platform.detect_platform().key == "local"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        manager = CheckpointManager()
    assert manager.directory == tmp_path / "checkpoints" / "default"
    assert CheckpointManager(run="exp-2").directory == tmp_path / "checkpoints" / "exp-2"
    manager.save({"x": 1}, step=1)
    assert (tmp_path / "checkpoints" / "default" / "step-000000001.json").is_file()


def test_colab_without_mounted_drive_says_to_mount_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    platform_neutral_env(monkeypatch, tmp_path)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20250101-060000_RC00")
    assert not Path("/content/drive/MyDrive").exists()
    with pytest.raises(CheckpointError, match=r"/content/drive/MyDrive .*mount it first"):
        CheckpointManager()


def test_a_platform_where_nothing_persists_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    platform_neutral_env(monkeypatch, tmp_path)
    monkeypatch.setenv("BINDER_REPO_URL", "https://github.com/example/repo")
    with pytest.warns(CheckpointWarning, match="nothing survives a Binder session: .*; "
                      "download them or pass directory=$"):
        manager = CheckpointManager()
    assert manager.directory == Path("/tmp/checkpoints/default")  # Binder's scratch disk


# -- random generators ------------------------------------------------------------------------

def draws() -> tuple[float, float, float, torch.Tensor]:
    """One draw from each global generator: random, NumPy (uniform, Gaussian), torch."""
    return random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(4)


def test_random_generators_continue_as_after_the_save(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    draws()
    np.random.randn()  # leaves a cached Gaussian in NumPy's legacy state
    manager.save({"x": 1}, step=1)
    expected = draws()

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    manager.load({"x": None}, restore_rng=False)
    untouched = draws()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    assert differences(draws(), untouched) == []  # restore_rng=False leaves them alone
    assert differences(untouched, expected) != []

    manager.load({"x": None})
    assert differences(draws(), expected) == []


def test_a_mismatched_restore_changes_nothing(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    manager.save({"model": nn.Linear(3, 2), "buffer": torch.ones(4)}, step=0)
    model, buffer = nn.Linear(3, 2), torch.zeros(4)
    before = copy.deepcopy(model.state_dict())
    wider = {"model": model, "buffer": torch.zeros(5)}
    with pytest.raises(CheckpointError, match=r"cannot restore 'buffer': the checkpoint holds "
                       r"\(4,\), the live tensor is \(5,\)"):
        manager.load(wider)
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())
    with pytest.raises(CheckpointError, match="cannot restore 'model': shapes differ for weight"):
        manager.load({"model": nn.Linear(3, 3), "buffer": buffer})
    assert torch.equal(buffer, torch.zeros(4))
    no_bias = nn.Linear(3, 2, bias=False)
    with pytest.raises(CheckpointError, match=r"unexpected bias \(strict=False skips"):
        manager.load({"model": no_bias})
    manager.load({"model": no_bias}, strict=False)
    assert no_bias.weight.shape == (2, 3)


def test_without_torch_the_manager_names_the_extra_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what an environment without torch has
    with pytest.raises(ImportError) as missing:
        CheckpointManager(tmp_path / "run")
    assert str(missing.value) == ("torch is required for this feature: "
                                  "pip install 'ipycloud[torch]'")
    assert not isinstance(missing.value, ModuleNotFoundError)


def test_a_refused_save_creates_no_folder(tmp_path: Path) -> None:
    folder = tmp_path / "never"
    with pytest.raises(CheckpointError, match="has no state_dict"):
        CheckpointManager(folder).save({"bad": object()}, step=0)
    with pytest.raises(ValueError, match="metric 'loss' must be a number"):
        CheckpointManager(folder).save({"ok": 1}, step=0, metrics={"loss": "low"})
    assert not folder.exists()
