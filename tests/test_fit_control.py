"""``fit`` does what it says: interrupts pause, metrics and callbacks, early stops, best
checkpoints, and plain words where it used to surprise."""

from __future__ import annotations

import contextlib
import io
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import differences
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointError, CheckpointManager
from ipycloud.runtime.train import precision
from ipycloud.runtime.train.callback import Callback, StopTraining
from ipycloud.runtime.train.early_stopping import EarlyStopping
from ipycloud.runtime.train.interrupt import DeferredInterrupt, FitInterrupted
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


class InterruptAt(Callback):
    """Sends this process SIGINT after a given step, as the notebook's Stop button does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
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


class InterruptOnLine(io.StringIO):
    """Standard output that sends this process SIGINT as soon as ``line`` is printed, as
    the Stop button pressed right when a cell shows that line."""

    def __init__(self, line: str) -> None:
        super().__init__()
        self.line, self.sent = line, False

    def write(self, text: str) -> int:
        written = super().write(text)
        if not self.sent and self.line in self.getvalue():
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return written


def test_an_interrupt_right_at_the_first_line_pauses_before_the_first_step(
        tmp_path: Path) -> None:
    whole, _ = run(tmp_path / "whole")
    out = InterruptOnLine("ipycloud.fit: starting")
    with contextlib.redirect_stdout(out), pytest.raises(KeyboardInterrupt) as raised:
        run(tmp_path / "paused", progress="bar")
    assert isinstance(raised.value, FitInterrupted), out.getvalue()
    line = "ipycloud.fit: interrupted at step 0; rerun this cell to continue"
    assert out.getvalue().splitlines()[-1] == line
    assert [info.step for info in CheckpointManager(tmp_path / "paused").list()] == [0]
    resumed, _ = run(tmp_path / "paused")
    assert differences(resumed.state_dict(), whole.state_dict()) == []


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


def test_early_stopping_and_the_best_checkpoint_agree_on_a_tie(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1, keep_best=("val_score", "max"))
    _, history = run(manager, epochs=5, val_data=data(),
                     callbacks=[EarlyStopping("val_score", patience=2)],
                     metrics={"score": Scores([0.3, 0.9, 0.9, 0.4, 1.0])})
    assert history.stopped is not None and "since epoch 1 (0.9)" in history.stopped
    model, _ = model_and_optimizer()
    best = manager.load({"model": model}, which="best", strict=False)
    assert best.step == 2 * STEPS_PER_EPOCH  # the end of epoch 1, as the stop says


def test_early_stopping_ends_the_run_and_the_rerun_says_it_is_complete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    score = Scores([0.3, 0.9, 0.5, 0.4, 1.0, 1.0])
    _, history = run(tmp_path, epochs=6, val_data=data(), metrics={"score": score},
                     callbacks=[EarlyStopping("val_score", patience=2)])
    assert len(history.epochs) == 4
    assert history.stopped == ("early stop: val_score has not improved for 2 epochs since "
                               "epoch 1 (0.9) (step 16)")
    capsys.readouterr()
    _, again = run(tmp_path, epochs=6, val_data=data(), metrics={"score": score},
                   callbacks=[EarlyStopping("val_score", patience=2)], progress=True)
    assert len(score.calls) == 4  # nothing validated again
    assert again.epochs == history.epochs
    assert "already complete at step 16" in capsys.readouterr().out


def test_early_stopping_counts_its_patience_across_a_resume(tmp_path: Path) -> None:
    """Epochs 2 and 3 do not beat epoch 1: the run stops after epoch 3, also when it was
    interrupted in epoch 2 and resumed by a new call with a new EarlyStopping."""
    values = [0.3, 0.9, 0.5, 0.4, 1.0, 1.0]
    options = {"epochs": 6, "val_data": data()}
    _, whole = run(tmp_path / "whole", metrics={"score": Scores(values)},
                   callbacks=[EarlyStopping("val_score", patience=2)], **options)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "paused", metrics={"score": Scores(values)},
            callbacks=[EarlyStopping("val_score", patience=2),
                       InterruptAt(2 * STEPS_PER_EPOCH + 1)], **options)
    _, resumed = run(tmp_path / "paused", metrics={"score": Scores(values[2:])},
                     callbacks=[EarlyStopping("val_score", patience=2)], **options)
    assert whole.stopped == ("early stop: val_score has not improved for 2 epochs since "
                             "epoch 1 (0.9) (step 16)")
    assert resumed.stopped == whole.stopped and len(resumed.epochs) == 4


@pytest.mark.parametrize("saving", [
    {"checkpoint_every_steps": STEPS_PER_EPOCH},  # a save due as each epoch ends
    {"keep_best": ("val_score", "max")},  # a save taken at each epoch's end
])
def test_a_run_stopped_early_where_a_save_falls_is_complete_when_rerun(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], saving: dict[str, Any]) -> None:
    def checkpoint() -> Any:
        if "keep_best" in saving:
            return CheckpointManager(tmp_path, keep_best=saving["keep_best"])
        return tmp_path

    every = {"checkpoint_every_steps": saving.get("checkpoint_every_steps")}
    score = Scores([0.3, 0.9, 0.5, 0.4, 1.0, 1.0])
    options = {"epochs": 6, "val_data": data(), "metrics": {"score": score},
               "callbacks": [EarlyStopping("val_score", patience=2)], **every}
    _, history = run(checkpoint(), **options)
    assert len(history.epochs) == 4
    capsys.readouterr()
    _, again = run(checkpoint(), progress=True, **options)
    assert len(score.calls) == 4  # nothing trained or validated again
    assert again.epochs == history.epochs and again.stopped == history.stopped
    assert "already complete at step 16" in capsys.readouterr().out


def test_a_run_a_callback_stops_where_a_save_falls_is_complete_when_rerun(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class StopAt(Callback):
        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            if step == 6:
                raise StopTraining

    _, history = run(tmp_path, callbacks=[StopAt()], checkpoint_every_steps=2)
    assert history.steps[-1]["step"] == 6
    capsys.readouterr()
    _, again = run(tmp_path, callbacks=[StopAt()], checkpoint_every_steps=2, progress=True)
    assert again.stopped == history.stopped
    assert "already complete at step 6" in capsys.readouterr().out


def test_a_callback_stops_the_run_by_raising_stop_training() -> None:
    class AfterEpoch(Callback):
        def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
            if epoch == 1:
                raise StopTraining

    class Enough(Callback):
        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            if step == 3:
                raise StopTraining("enough")

    _, history = run(callbacks=[AfterEpoch()])
    assert len(history.epochs) == 2 and "AfterEpoch.on_epoch asked to stop" in \
        history.stopped
    _, history = run(callbacks=[Enough()])
    assert history.steps[-1]["step"] == 3 and history.stopped == "enough (step 3)"


def test_a_finished_run_is_not_validated_again(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    score = Scores([0.5, 0.6, 0.7])
    options = {"epochs": 2, "val_data": data(), "metrics": {"score": score},
               "checkpoint_every_steps": 2 * STEPS_PER_EPOCH}  # saved before the last epoch ends
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
        ({"metrics": {"f1": 3}}, TypeError, "metrics must be a dict of name -> fn"),
        ({"log_every": 0}, ValueError, "log_every must be a positive integer"),
        ({"progress": "yes"}, ValueError, "progress must be True (a bar, and live curves in "
                                          "a notebook), 'bar' (the bar only) or False, not "
                                          "'yes'"),
        ({"progress": 1}, ValueError, "progress must be True"),
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


@pytest.mark.parametrize("name", ["tpu", "TPU:0"])
def test_a_tpu_asked_for_by_name_says_what_works_in_one_error(name: str) -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(ValueError) as caught:
        fit(model, optimizer, data(), device=name, progress=False)
    assert str(caught.value) == (
        f"device must be 'auto', 'cpu', 'cuda', 'cuda:N', 'mps', 'xla' or a torch.device, not "
        f"{name!r}: a TPU is an XLA device, reached through torch_xla (pip install "
        "'ipycloud[xla]', then device='auto' or 'xla')")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chain


def test_xla_without_torch_xla_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from ipycloud.runtime.train import device

    monkeypatch.setattr(device, "xla_available", lambda: False)
    with pytest.raises(ValueError) as caught:
        device.choose_device("xla")
    assert str(caught.value) == ("device='xla' needs torch_xla: pip install 'ipycloud[xla]', "
                                 "then device='auto' or 'xla'")


def test_cuda_without_a_visible_gpu_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ipycloud.runtime.train import device

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(device, "_gpus_and_problems", lambda: ())
    with pytest.raises(ValueError, match="needs an NVIDIA GPU, and none is visible"):
        device.choose_device("cuda:0")


def test_a_checkpoint_in_a_file_is_refused_before_training(tmp_path: Path) -> None:
    a_file = tmp_path / "weights.pt"
    a_file.write_bytes(b"not a folder")
    model, optimizer = model_and_optimizer()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"checkpoint= must be a folder, and .*weights.pt is "
                                         "a file"):
        fit(model, optimizer, data(), checkpoint=a_file, device="cpu", progress=False)
    assert differences(model.state_dict(), before) == []  # not one step taken
    assert a_file.read_bytes() == b"not a folder"


@pytest.mark.parametrize(("options", "message"), [
    ({"stop": "val_loss"}, "EarlyStopping watches 'val_loss', which only val_data= gives"),
    ({"stop": "val_f1", "val_data": "data"},
     "EarlyStopping watches 'val_f1', which no epoch of this run reports (they report "
     "train_loss, val_loss, val_accuracy)"),
    ({"stop": "accuracy"}, "EarlyStopping watches 'accuracy', which no epoch"),
    ({"keep_best": ("val_loss", "min")}, "the checkpoint's keep_best watches 'val_loss', "
                                         "which only val_data= gives"),
])
def test_a_watched_metric_no_epoch_reports_is_refused_before_training(
        tmp_path: Path, options: dict[str, Any], message: str) -> None:
    seen: list[int] = []

    class Steps(Callback):
        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            seen.append(step)

    if options.pop("val_data", None):
        options["val_data"] = data()
    keep_best = options.pop("keep_best", None)
    checkpoint = CheckpointManager(tmp_path / "run", keep_best=keep_best) if keep_best else None
    stop = options.pop("stop", None)
    callbacks = [Steps(), *([EarlyStopping(stop, patience=2)] if stop else [])]
    with pytest.raises(ValueError) as caught:
        run(checkpoint, callbacks=callbacks, **options)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert seen == []


def test_a_checkpoint_that_does_not_fit_names_what_fit_takes(tmp_path: Path) -> None:
    run(tmp_path / "run", epochs=1)
    other = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
    with pytest.raises(CheckpointError) as caught:
        fit(other, torch.optim.SGD(other.parameters(), lr=0.1), data(), epochs=2,
            checkpoint=tmp_path / "run", device="cpu", progress=False)
    message = str(caught.value)
    assert message.startswith(f"cannot resume from {tmp_path / 'run'}: cannot restore 'model'")
    assert message.endswith("pass resume=False to start afresh, or another checkpoint= folder")
    assert "strict" not in message


class StopAt(Callback):
    """Stops the run after a given step, as a kill would (the checkpoint is then resumed)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        if step == self.step:
            raise StopTraining


def test_a_resumed_history_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    """Log windows of 3 steps, a checkpoint every 5: the resumed run's rows and epoch
    losses fall where the uninterrupted run's do."""
    options = {"epochs": 3, "log_every": 3, "checkpoint_every_steps": 5, "val_data": data()}
    _, whole = run(tmp_path / "whole", **options)
    run(tmp_path / "stopped", callbacks=[StopAt(7)], **options)
    manager = CheckpointManager(tmp_path / "stopped")
    for info in manager.list()[1:]:  # back to the periodic checkpoint of step 5
        info.manifest_path.unlink()
    _, resumed = run(tmp_path / "stopped", **options)
    assert [row["step"] for row in whole.steps] == [3, 4, 6, 8, 9, 12]
    assert resumed.steps == whole.steps
    assert resumed.epochs == [{**row, "seconds": resumed.epochs[index]["seconds"]}
                              for index, row in enumerate(whole.epochs)]
