"""What ``fit`` tells the followers of a run, in order, and that a failing follower never
breaks the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ipycloud
from ipycloud.runtime.train import followers as following
from ipycloud.runtime.train.followers import RunEnd, RunStart


class Recorder:
    """Notes every call as (method, argument)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def started(self, start: RunStart) -> None:
        self.calls.append(("started", start))

    def stepped(self, row: dict[str, Any]) -> None:
        self.calls.append(("stepped", row))

    def epoch_ended(self, logs: dict[str, Any]) -> None:
        self.calls.append(("epoch_ended", logs))

    def checkpointed(self, checkpoint: dict[str, Any]) -> None:
        self.calls.append(("checkpointed", checkpoint))

    def happened(self, event: str, message: str) -> None:
        self.calls.append(("happened", (event, message)))

    def ended(self, end: RunEnd) -> None:
        self.calls.append(("ended", end))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class Broken:
    def stepped(self, row: dict[str, Any]) -> None:
        raise OSError("no space left on device")


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    saved = list(following._registered)
    following.register_follower(lambda start: recorder)
    yield recorder
    following._registered[:] = saved


def problem(samples: int = 64) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    dataset = torch.utils.data.TensorDataset(torch.randn(samples, 4),
                                             torch.randint(0, 2, (samples,)))
    return (model, torch.optim.SGD(model.parameters(), lr=0.1),
            torch.utils.data.DataLoader(dataset, batch_size=8))


def test_a_run_is_told_in_order_with_its_figures(recorder: Recorder, tmp_path: Path) -> None:
    model, optimizer, data = problem()
    ipycloud.fit(model, optimizer, data, epochs=2, val_data=data, progress=False,
                 checkpoint=tmp_path / "run 'one'", log_every=4)

    assert recorder.names() == ["started", "stepped", "stepped", "epoch_ended", "stepped",
                                "stepped", "epoch_ended", "checkpointed", "ended"]
    start = recorder.calls[0][1]
    assert (start.folder, start.step, start.total_steps, start.epochs) == (
        tmp_path / "run 'one'", 0, 16, 2)
    assert start.details["model"] == "Linear" and start.details["parameters"] == 10
    assert start.details["batch_size"] == 8 and start.details["optimizer"] == "SGD"
    rows = [argument for name, argument in recorder.calls if name == "stepped"]
    assert [row["step"] for row in rows] == [4, 8, 12, 16]
    assert all(row["samples_per_s"] == pytest.approx(8 * row["steps_per_s"]) for row in rows)
    epochs = [argument for name, argument in recorder.calls if name == "epoch_ended"]
    assert [logs["epoch"] for logs in epochs] == [0, 1] and "val_loss" in epochs[0]
    assert recorder.calls[-2][1]["step"] == 16
    assert recorder.calls[-1][1] == RunEnd(status="finished", reason=None, step=16, epoch=2)


def test_early_stop_is_an_event_and_the_end(recorder: Recorder) -> None:
    model, optimizer, data = problem()

    class StopAtOnce:
        def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> bool:
            return True

    ipycloud.fit(model, optimizer, data, epochs=3, progress=False, callbacks=[StopAtOnce()])

    assert recorder.calls[-2][0] == "happened" and recorder.calls[-2][1][0] == "early_stop"
    end = recorder.calls[-1][1]
    assert (end.status, end.step) == ("stopped early", 8)
    assert "StopAtOnce.on_epoch_end asked to stop" in end.reason


def test_a_failing_run_ends_failed_with_the_error_line(recorder: Recorder) -> None:
    model, optimizer, data = problem()

    def broken_loss(outputs: Any, targets: Any) -> Any:
        raise RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB")

    with pytest.raises(RuntimeError):
        ipycloud.fit(model, optimizer, data, loss_fn=broken_loss, progress=False)

    assert recorder.calls[-1] == ("ended", RunEnd(
        status="failed", reason="RuntimeError: CUDA out of memory.", step=0, epoch=0))


def test_a_follower_that_raises_is_dropped_with_a_warning(recorder: Recorder) -> None:
    following.register_follower(lambda start: Broken())
    model, optimizer, data = problem()

    with pytest.warns(RuntimeWarning, match="Broken stopped following the run: OSError"):
        history = ipycloud.fit(model, optimizer, data, epochs=1, progress=False, log_every=2)

    assert [row["step"] for row in history.steps] == [2, 4, 6, 8]
    assert recorder.names().count("stepped") == 4 and recorder.names()[-1] == "ended"
