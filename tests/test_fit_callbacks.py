"""The one callback protocol of ``fit``: what it tells a Callback, in order; how a callback
stops the run; what becomes of a callback that raises (the user's error stops fit, one of
fit's own parts is dropped with a warning); and the one-line errors for what is not one."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ipycloud
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.train import callback as callbacks
from ipycloud.runtime.train.callback import Callback, RunEnd, RunStart, StopTraining
from ipycloud.runtime.train.early_stopping import EarlyStopping


class Recorder(Callback):
    """Notes every call as (hook, argument); the logged rows only, as the run record."""

    every_step = False

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_start(self, start: RunStart) -> None:
        self.calls.append(("on_start", start))

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        self.calls.append(("on_step", logs))

    def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        self.calls.append(("on_epoch", logs))

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        self.calls.append(("on_checkpoint", info))

    def on_event(self, event: str, message: str) -> None:
        self.calls.append(("on_event", (event, message)))

    def on_end(self, end: RunEnd) -> None:
        self.calls.append(("on_end", end))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class Broken(Callback):
    every_step = False

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        raise OSError("no space left on device")


@pytest.fixture
def front() -> Iterator[Recorder]:
    """A Recorder registered as a front's callback (as the notebook's curves are)."""
    recorder = Recorder()
    saved = list(callbacks._fronts)
    callbacks.register_front(lambda start: recorder)
    yield recorder
    callbacks._fronts[:] = saved


def problem(samples: int = 64) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    dataset = torch.utils.data.TensorDataset(torch.randn(samples, 4),
                                             torch.randint(0, 2, (samples,)))
    return (model, torch.optim.SGD(model.parameters(), lr=0.1),
            torch.utils.data.DataLoader(dataset, batch_size=8))


def test_a_run_is_told_in_order_with_its_figures(tmp_path: Path) -> None:
    model, optimizer, data = problem()
    recorder = Recorder()
    ipycloud.fit(model, optimizer, data, epochs=2, val_data=data, progress=False,
                 checkpoint=tmp_path / "run 'one'", log_every=4, callbacks=[recorder])

    assert recorder.names() == ["on_start", "on_step", "on_step", "on_epoch", "on_step",
                                "on_step", "on_epoch", "on_checkpoint", "on_end"]
    start = recorder.calls[0][1]
    assert (start.folder, start.step, start.total_steps, start.epochs) == (
        tmp_path / "run 'one'", 0, 16, 2)
    assert start.details["model"] == "Linear" and start.details["parameters"] == 10
    assert start.details["batch_size"] == 8 and start.details["optimizer"] == "SGD"
    rows = [argument for name, argument in recorder.calls if name == "on_step"]
    assert [row["step"] for row in rows] == [4, 8, 12, 16]
    assert all(row["samples_per_s"] == pytest.approx(8 * row["steps_per_s"]) for row in rows)
    epochs = [argument for name, argument in recorder.calls if name == "on_epoch"]
    assert [logs["epoch"] for logs in epochs] == [0, 1] and "val_loss" in epochs[0]
    assert recorder.calls[-2][1].step == 16
    assert recorder.calls[-1][1] == RunEnd(status="finished", reason=None, step=16, epoch=2)


def test_a_callback_of_every_step_sees_the_loss_where_it_is_read() -> None:
    seen: list[tuple[int, bool]] = []

    class Steps(Callback):
        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            seen.append((step, logs["loss"] is not None))

    model, optimizer, data = problem()
    ipycloud.fit(model, optimizer, data, epochs=1, progress=False, log_every=3,
                 callbacks=[Steps()])

    assert seen == [(step, step % 3 == 0) for step in range(1, 9)]


def test_stop_training_is_an_event_and_the_end(front: Recorder) -> None:
    model, optimizer, data = problem()

    class StopAtOnce(Callback):
        def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
            raise StopTraining

    ipycloud.fit(model, optimizer, data, epochs=3, progress=False, callbacks=[StopAtOnce()])

    assert front.calls[-2][0] == "on_event" and front.calls[-2][1][0] == "early_stop"
    end = front.calls[-1][1]
    assert (end.status, end.step) == ("stopped early", 8)
    assert "StopAtOnce.on_epoch asked to stop" in end.reason


def test_a_failing_run_ends_failed_with_the_error_line(front: Recorder) -> None:
    model, optimizer, data = problem()

    def broken_loss(outputs: Any, targets: Any) -> Any:
        raise RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB")

    with pytest.raises(RuntimeError):
        ipycloud.fit(model, optimizer, data, loss_fn=broken_loss, progress=False)

    assert front.calls[-1] == ("on_end", RunEnd(
        status="failed", reason="RuntimeError: CUDA out of memory.", step=0, epoch=0))


def test_a_front_callback_that_raises_is_dropped_with_a_warning(front: Recorder) -> None:
    callbacks.register_front(lambda start: Broken())
    model, optimizer, data = problem()

    with pytest.warns(RuntimeWarning, match="Broken stopped following the run: OSError"):
        history = ipycloud.fit(model, optimizer, data, epochs=1, progress=False, log_every=2)

    assert [row["step"] for row in history.steps] == [2, 4, 6, 8]
    assert front.names().count("on_step") == 4 and front.names()[-1] == "on_end"


def test_a_users_callback_that_raises_stops_fit_with_its_traceback(front: Recorder) -> None:
    class Faulty(Callback):
        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            if step == 3:
                raise KeyError("val_acc")

    model, optimizer, data = problem()
    with pytest.raises(KeyError) as caught:
        ipycloud.fit(model, optimizer, data, epochs=1, progress=False, callbacks=[Faulty()])

    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-1] == "on_step"  # the user's own line is shown
    assert front.calls[-1] == ("on_end", RunEnd(
        status="failed", reason="KeyError: 'val_acc'", step=3, epoch=0))


class OnStepEnd(Callback):
    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:  # the old name
        raise AssertionError("never called")


class DuckTyped:
    def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        raise AssertionError("never called")


@pytest.mark.parametrize(("given", "message"), [
    ([DuckTyped()], "callbacks: DuckTyped is not an ipycloud.Callback: subclass it and "
                    "override the hooks you need (on_start, on_step, on_epoch, on_checkpoint, "
                    "on_event, on_end)"),
    ([OnStepEnd()], "callbacks: OnStepEnd.on_step_end is not a hook fit calls (they are "
                    "on_start, on_step, on_epoch, on_checkpoint, on_event, on_end)"),
    (EarlyStopping("train_loss"), "callbacks must be a list of ipycloud.Callback, not "
                                  "EarlyStopping"),
])
def test_what_is_not_a_callback_is_a_one_line_error_before_any_step(
        front: Recorder, given: Any, message: str) -> None:
    model, optimizer, data = problem()
    before = model.weight.detach().clone()
    with pytest.raises(TypeError) as caught:
        ipycloud.fit(model, optimizer, data, progress=False, callbacks=given)
    assert str(caught.value) == message
    assert torch.equal(model.weight, before) and front.calls == []


@pytest.mark.parametrize(("arguments", "message"), [
    (("val_loss", 0), "EarlyStopping's patience is a number of epochs >= 1, not 0"),
    (("val_loss", 2, "lowest"), "EarlyStopping's mode is 'min', 'max' or 'auto', not 'lowest'"),
    ((3,), "EarlyStopping's metric is an epoch metric's name such as 'val_loss', not 3"),
])
def test_early_stopping_refuses_what_it_cannot_watch(arguments: tuple[Any, ...],
                                                     message: str) -> None:
    with pytest.raises((TypeError, ValueError)) as caught:
        EarlyStopping(*arguments)
    assert str(caught.value) == message


def test_early_stopping_mode_follows_the_metrics_name_unless_given() -> None:
    assert [EarlyStopping("val_loss").mode, EarlyStopping("val_accuracy").mode,
            EarlyStopping("val_loss", mode="max").mode] == ["min", "max", "max"]
