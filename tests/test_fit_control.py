"""``fit`` does what it says: interrupts pause, metrics and callbacks, early stops, best
checkpoints, and plain words where it used to surprise."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import differences
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.train import precision
from ipycloud.runtime.train.interrupt import DeferredInterrupt
from ipycloud.runtime.train.loop import fit

STEPS_PER_EPOCH = 4


def data(samples: int = 16 * STEPS_PER_EPOCH) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 6, generator=generator)
    return DataLoader(TensorDataset(inputs, inputs[:, :3].argmax(dim=1)), batch_size=16,
                      shuffle=True)


def model_and_optimizer(lr: float = 0.1) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def run(checkpoint: Any = None, lr: float = 0.1, **options: Any) -> tuple[nn.Module, Any]:
    model, optimizer = model_and_optimizer(lr)
    options = {"epochs": 3, "device": "cpu", "progress": False, "seed": 3, **options}
    return model, fit(model, optimizer, data(), checkpoint=checkpoint, **options)


class InterruptAt:
    """Sends this process SIGINT after a given step, as the notebook's Stop button does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
        if step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupt_saves_the_step_and_the_rerun_continues_bit_for_bit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole, _ = run(tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "paused", callbacks=[InterruptAt(6)])
    assert "ipycloud.fit: interrupted at step 6; rerun this cell to continue" in \
        capsys.readouterr().out
    assert [info.step for info in CheckpointManager(tmp_path / "paused").list()] == [6]
    resumed, history = run(tmp_path / "paused")
    assert differences(resumed.state_dict(), whole.state_dict()) == []
    assert [row["epoch"] for row in history.epochs] == [0, 1, 2]


def test_an_interrupt_without_a_checkpoint_folder_says_the_rerun_starts_over(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KeyboardInterrupt):
        run(callbacks=[InterruptAt(2)])
    assert ("interrupted at step 2; no checkpoint= was given, so rerunning this cell starts "
            "over") in capsys.readouterr().out


def test_a_second_interrupt_stops_at_once_and_the_handler_is_put_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), DeferredInterrupt("noted") as interrupt:
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupt.requested
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


class Scores:
    """A validation metric whose value per epoch is fixed by the test."""

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self.calls: list[tuple[torch.Size, torch.Tensor]] = []

    def __call__(self, predictions: torch.Tensor, labels: torch.Tensor) -> float:
        self.calls.append((predictions.shape, labels))
        return self.values[len(self.calls) - 1]


def test_metrics_see_the_whole_validation_set_once_an_epoch() -> None:
    score = Scores([0.1, 0.2])
    validation = data(40)
    validation = DataLoader(validation.dataset, batch_size=16)  # in order: 16, 16 and 8
    _, history = run(epochs=2, val_data=validation, metrics={"score": score})
    assert [row["val_score"] for row in history.epochs] == [0.1, 0.2]
    shape, labels = score.calls[0]
    assert shape == (40, 3) and torch.equal(labels, validation.dataset.tensors[1])


def test_the_best_checkpoint_carries_the_epoch_metrics_and_loads_as_best(
        tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1, keep_best=("val_score", "max"))
    run(manager, epochs=4, val_data=data(), metrics={"score": Scores([0.3, 0.9, 0.5, 0.4])})
    by_step = {info.step: info.metrics for info in manager.list()}
    best = 2 * STEPS_PER_EPOCH
    assert set(by_step) == {best, 4 * STEPS_PER_EPOCH}  # the best and the last
    assert by_step[best]["val_score"] == 0.9 and "train_loss" in by_step[best]
    model, _ = model_and_optimizer()
    assert manager.load({"model": model}, which="best", strict=False).step == best


def test_early_stopping_ends_the_run_and_the_rerun_says_it_is_complete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    score = Scores([0.3, 0.9, 0.5, 0.4, 1.0, 1.0])
    _, history = run(tmp_path, epochs=6, val_data=data(), metrics={"score": score},
                     early_stop=("val_score", 2))
    assert len(history.epochs) == 4
    assert history.stopped == ("early stop: val_score has not improved for 2 epoch(s) since "
                               "epoch 1 (0.9) (step 16)")
    capsys.readouterr()
    _, again = run(tmp_path, epochs=6, val_data=data(), metrics={"score": score},
                   early_stop=("val_score", 2), progress=True)
    assert len(score.calls) == 4  # nothing validated again
    assert again.epochs == history.epochs
    assert "already complete at step 16" in capsys.readouterr().out


def test_a_callback_stops_the_run_by_returning_true_or_by_its_stop_flag() -> None:
    class AfterEpoch:
        def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> bool:
            return epoch == 1

    class Flag:
        stop = False
        reason = "enough"

        def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
            self.stop = step == 3

    _, history = run(callbacks=[AfterEpoch()])
    assert len(history.epochs) == 2 and "AfterEpoch.on_epoch_end asked to stop" in \
        history.stopped
    _, history = run(callbacks=[Flag()])
    assert history.steps[-1]["step"] == 3 and history.stopped == "enough (step 3)"


def test_a_finished_run_is_not_validated_again(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    score = Scores([0.5, 0.6, 0.7])
    options = {"epochs": 2, "val_data": data(), "metrics": {"score": score},
               "checkpoint_every": 2 * STEPS_PER_EPOCH}  # saved before the last epoch ends
    _, history = run(tmp_path, **options)
    capsys.readouterr()
    _, again = run(tmp_path, progress=True, **options)
    assert len(score.calls) == 2 and again.epochs == history.epochs
    assert f"already complete at step {2 * STEPS_PER_EPOCH} (epoch 2)" in \
        capsys.readouterr().out


def test_settings_taken_from_the_checkpoint_are_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(tmp_path, epochs=None, max_steps=2, lr=0.1)
    capsys.readouterr()
    run(tmp_path, epochs=None, max_steps=4, lr=0.01, progress=True)
    assert ("taken from the checkpoint, not from this cell: lr 0.1 (this cell: 0.01)"
            in capsys.readouterr().out)


def test_reduce_on_plateau_without_validation_steps_on_the_train_loss(
        capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)  # no real progress: a plateau
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
    fit(model, optimizer, data(), epochs=3, scheduler=scheduler, device="cpu", seed=3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.25e-12)  # halved twice
    assert "ReduceLROnPlateau steps on train_loss (no val_data)" in capsys.readouterr().out


def test_a_cpu_trains_in_fp32_even_with_bfloat16_instructions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "_cpu_has_bf16", lambda: True, raising=False)
    chosen = precision.resolve_precision("auto", torch.device("cpu"), "cpu")
    assert chosen.name == "fp32" and "precision='bf16' to try it" in chosen.reason


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"resume": True}, ValueError, "resume=True needs checkpoint="),
        ({"device": "cuda"}, ValueError, "device='cuda' needs CUDA, but this torch"),
        ({"device": "cuda:7x"}, ValueError, "device must be 'auto', 'cpu'"),
        ({"optimizer": "other"}, ValueError, "the optimizer holds none of the model's "
                                             "parameters"),
        ({"train_data": [(torch.randn(4, 6), torch.zeros(4, 2, dtype=torch.long))]},
         ValueError, "pass loss_fn=, e.g. torch.nn.functional.cross_entropy"),
        ({"early_stop": ("val_loss",)}, ValueError, "early_stop is (metric, patience"),
        ({"metrics": {"f1": 3}}, TypeError, "metrics must be a dict of name -> fn"),
        ({"log_every": 0}, ValueError, "log_every must be a positive integer"),
    ],
)
def test_surprises_are_one_line_errors(options: dict[str, Any], error: type,
                                       message: str) -> None:
    model, optimizer = model_and_optimizer()
    if options.get("optimizer") == "other":
        options["optimizer"] = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    arguments = {"model": model, "optimizer": optimizer, "train_data": data(),
                 "device": "cpu", "progress": False, **options}
    with pytest.raises(error) as caught:
        fit(**arguments)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_cuda_without_a_visible_gpu_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ipycloud.runtime.train import device

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(device, "_visible_gpus", lambda: ())
    with pytest.raises(ValueError, match="needs an NVIDIA GPU, and none is visible"):
        device.choose_device("cuda:0")
