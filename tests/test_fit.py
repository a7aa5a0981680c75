"""``fit`` on real torch (CPU): precision, accumulation, clipping, resume, bad input."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from checkpoint_helpers import differences
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ipycloud.runtime.checkpoint import CheckpointManager, auto
from ipycloud.runtime.train.arguments import checkpoint_schedule
from ipycloud.runtime.train.batches import to_device
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.data import loader
from ipycloud.runtime.train.loop import NonFiniteLossError, fit


def classification_data(samples: int = 256, features: int = 8, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=generator)
    labels = (inputs[:, :4].argmax(dim=1)).long()
    return TensorDataset(inputs, labels)


def mlp(features: int = 8, classes: int = 4, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(32, classes))


def test_fp32_training_learns_and_reports() -> None:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = classification_data()
    history = fit(model, optimizer, DataLoader(data, batch_size=32, shuffle=True), epochs=4,
                  val_data=DataLoader(data, batch_size=64), precision="fp32", device="cpu")
    losses = history.table("epochs")["train_loss"]
    assert len(losses) == 4 and losses[-1] < losses[0] * 0.7
    assert history.epochs[-1]["val_accuracy"] > 0.6
    assert [row["epoch"] for row in history.epochs] == [0, 1, 2, 3]
    assert history.steps[-1]["step"] == 4 * 8
    assert "<table>" in history._repr_html_() and "val_loss" in str(history)


def test_the_first_line_names_device_precision_and_why(capsys) -> None:
    model = mlp()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(classification_data(64), batch_size=32), precision="fp32", device="auto")
    output = capsys.readouterr()
    line = next(text for text in (output.out + output.err).splitlines()
                if text.startswith("ipycloud.fit:"))
    assert "starting on cpu (no GPU visible, no torch_xla, no MPS)" in line
    assert "fp32 (as requested)" in line


class DtypeProbe(nn.Module):
    """Records the dtype its first layer computes in."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.seen: set[torch.dtype] = set()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.body[0](inputs)
        self.seen.add(hidden.dtype)
        return self.body[3](self.body[2](self.body[1](hidden)))


def test_bf16_autocasts_the_forward_pass_and_keeps_fp32_weights() -> None:
    model = DtypeProbe()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(classification_data(64), batch_size=16), precision="bf16", device="cpu",
        progress=False)
    assert model.seen == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}


class Exploding(nn.Module):
    """A linear layer whose output is multiplied by ``factor`` (to overflow fp16 gradients)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 4)
        self.factor = factor

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.linear(inputs) * self.factor


def test_fp16_scaler_skips_an_overflowing_step_and_lowers_the_scale(monkeypatch) -> None:
    monkeypatch.setattr("ipycloud.runtime.train.loop.LOG_EVERY", 1)
    model = Exploding(factor=1.0)
    before = copy.deepcopy(model.state_dict())
    batches = [(torch.randn(4, 8), torch.tensor([0, 1, 2, 3]))]
    batches[0][0][0, 0] = 6e4  # the fp16 forward pass overflows: the gradients are inf
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fit(model, optimizer, batches, max_steps=1, precision="fp16", device="cpu",
        progress=False, loss_fn=lambda outputs, targets: outputs.float().pow(2).mean())
    assert differences(model.state_dict(), before) == []  # the step was skipped


def test_fp16_overflowing_forever_is_reported_with_the_step() -> None:
    model = Exploding(factor=1.0)
    batches = [(torch.randn(4, 8), torch.tensor([0, 1, 2, 3]))] * 40

    def finite_loss_infinite_gradient(outputs: torch.Tensor, targets: Any) -> torch.Tensor:
        return torch.sqrt((outputs.float() * 0).sum())  # 0, but d sqrt(x)/dx at 0 is inf

    with pytest.raises(NonFiniteLossError, match=r"overflowed 25 optimizer steps in a row, up "
                                                 r"to step 25"):
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, epochs=1,
            precision="fp16", device="cpu", progress=False,
            loss_fn=finite_loss_infinite_gradient)


def test_a_nan_loss_stops_the_run_naming_the_steps_and_spares_the_checkpoints(
        tmp_path: Path) -> None:
    model = mlp()
    data = classification_data(64)
    good = [(inputs, labels) for inputs, labels in DataLoader(data, batch_size=8)]
    poisoned = [*good, (torch.full((8, 8), float("nan")), good[0][1]), *good]
    with pytest.raises(NonFiniteLossError, match=r"the loss is nan in optimizer steps 9 to 10 "
                                                 r"\(epoch 0\)"):
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), poisoned, epochs=1,
            precision="fp32", device="cpu", progress=False, checkpoint=tmp_path,
            checkpoint_every_steps=4)
    manager = CheckpointManager(tmp_path)
    assert [info.step for info in manager.list()] == [4, 8]  # NaN read at 10: nothing saved
    restored = mlp()
    manager.load({"model": restored}, strict=False)
    assert all(torch.isfinite(p).all() for p in restored.parameters())


@pytest.fixture
def auto_checkpoint(tmp_path: Path) -> Iterator[Any]:
    """Register ``%checkpoint auto`` of a model into tmp_path/auto, as the magic does."""

    def register(model: nn.Module, every_s: float) -> auto.AutoCheckpoint:
        registration = auto.AutoCheckpoint(
            manager=CheckpointManager(tmp_path / "auto", keep_last=None),
            collect=lambda: {"model": model}, names=("model",), every_s=every_s)
        auto.register(registration)
        return registration

    yield register
    auto.unregister()


def test_the_automatic_checkpoint_is_saved_between_steps_when_due(
        tmp_path: Path, auto_checkpoint: Any) -> None:
    model = mlp()
    data = DataLoader(classification_data(64), batch_size=16)  # 4 steps an epoch
    registration = auto_checkpoint(model, every_s=3600.0)
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, precision="fp32",
        device="cpu", progress=False)
    assert not (tmp_path / "auto").exists()  # never due: nothing written
    registration.every_s = 0.0  # due after every step
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, precision="fp32",
        device="cpu", progress=False)
    manager = registration.manager
    assert [info.step for info in manager.list()] == [0, 1, 2, 3]
    restored = mlp()
    manager.load({"model": restored})
    assert differences(restored.state_dict(), model.state_dict()) == []  # after the last step


def test_the_automatic_checkpoint_never_saves_a_nan_unseen(auto_checkpoint: Any) -> None:
    model = mlp()
    good = list(DataLoader(classification_data(64), batch_size=8))
    poisoned = [*good, (torch.full((8, 8), float("nan")), good[0][1]), *good]
    registration = auto_checkpoint(model, every_s=0.0)
    with pytest.raises(NonFiniteLossError, match="optimizer steps 9 to 9"):
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), poisoned, precision="fp32",
            device="cpu", progress=False)
    assert len(registration.manager.list()) == 8  # after steps 1 to 8, none after the NaN
    restored = mlp()
    registration.manager.load({"model": restored})
    assert all(torch.isfinite(p).all() for p in restored.parameters())


class Pair(NamedTuple):
    inputs: torch.Tensor
    labels: torch.Tensor


class PairDataset(Dataset):
    """Samples as namedtuples: the DataLoader collates them into namedtuple batches."""

    def __init__(self, data: TensorDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Pair:
        return Pair(*self.data[index])


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs CUDA: batches moved")),
])
def test_namedtuple_batches_train_and_keep_their_type_on_the_device(device: str) -> None:
    batches = DataLoader(PairDataset(classification_data(64)), batch_size=16)
    first = next(iter(batches))
    assert isinstance(first, Pair)
    moved = to_device(first, torch.device(device))  # what fit does off the CPU
    assert isinstance(moved, Pair) and moved.inputs.device.type == device
    assert torch.equal(moved.labels.cpu(), first.labels)
    model = mlp()
    history = fit(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, epochs=2,
                  precision="fp32", device=device, progress=False)
    assert history.steps[-1]["step"] == 8 and history.epochs[-1]["train_loss"] > 0


def big_batch_run(batch_size: int, grad_accum: int) -> dict[str, torch.Tensor]:
    model = mlp()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(classification_data(128), batch_size=batch_size), epochs=2,
        grad_accum=grad_accum, precision="fp32", device="cpu", progress=False)
    return model.state_dict()


def test_gradient_accumulation_equals_the_larger_batch() -> None:
    accumulated, big = big_batch_run(8, 4), big_batch_run(32, 1)
    for name, tensor in big.items():
        assert torch.allclose(accumulated[name], tensor, atol=1e-6), name
    assert not torch.equal(accumulated["0.weight"], mlp().state_dict()["0.weight"])


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_clipping_bounds_the_update(precision: str) -> None:
    model = Exploding(factor=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    batch = [(torch.randn(16, 8), torch.randint(0, 4, (16,)))]
    fit(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, max_steps=1,
        precision=precision, clip_grad_norm=0.01, device="cpu", progress=False)
    change = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before,
                                                                    strict=True)])
    assert 0.009 < change.norm() <= 0.0100001  # lr 1 x a gradient clipped to norm 0.01


class CountingDataset(Dataset):
    """A map-style dataset that counts the items it is asked for."""

    def __init__(self, inner: TensorDataset) -> None:
        self.inner = inner
        self.reads = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        self.reads += 1
        return self.inner[index]


def test_resuming_mid_epoch_does_not_read_the_skipped_batches(tmp_path: Path) -> None:
    data = classification_data(800)
    first = mlp()
    fit(first, torch.optim.SGD(first.parameters(), lr=0.1),
        DataLoader(data, batch_size=8, shuffle=True), max_steps=60, precision="fp32",
        device="cpu", progress=False, checkpoint=tmp_path, checkpoint_every_steps=60)
    counting = CountingDataset(data)
    second = mlp()
    fit(second, torch.optim.SGD(second.parameters(), lr=0.1),
        DataLoader(counting, batch_size=8, shuffle=True), epochs=1, precision="fp32",
        device="cpu", progress=False, checkpoint=tmp_path)
    assert counting.reads == 800 - 60 * 8  # only the rest of the epoch was read


def test_rerunning_a_finished_cell_trains_nothing_and_returns_the_history(
        tmp_path: Path) -> None:
    def run() -> Any:
        model = mlp()
        return model, fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          DataLoader(classification_data(64), batch_size=16), epochs=2,
                          precision="fp32", device="cpu", progress=False, checkpoint=tmp_path)

    model, history = run()
    again, rerun = run()
    assert differences(again.state_dict(), model.state_dict()) == []
    assert rerun.epochs == history.epochs and rerun.steps == history.steps


def test_a_killed_run_resumes_bit_for_bit_in_a_fresh_process(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(200, 6, generator=generator)
    data = {"inputs": inputs, "labels": inputs[:, :4].argmax(dim=1)}
    torch.save(data, tmp_path / "data.pt")

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ipycloud.cli.demo_training",
                               str(tmp_path / "data.pt"), *args, "--precision", "bf16",
                               "--device", "cpu"], capture_output=True, text=True, timeout=300)

    whole = script(str(tmp_path / "whole"), str(tmp_path / "whole.pt"))
    assert whole.returncode == 0, whole.stderr
    killed = script(str(tmp_path / "ckpt"), str(tmp_path / "never.pt"),
                    "--kill-after-checkpoint", "3")
    assert killed.returncode == -9, killed.stderr  # SIGKILL
    assert not (tmp_path / "never.pt").exists()
    resumed = script(str(tmp_path / "ckpt"), str(tmp_path / "resumed.pt"))
    assert resumed.returncode == 0, resumed.stderr
    expected = torch.load(tmp_path / "whole.pt", weights_only=True)
    actual = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert differences(actual["model"], expected["model"]) == []
    assert differences(actual["optimizer"], expected["optimizer"]) == []
    assert actual["steps"] == expected["steps"]  # the resumed run returns the whole history


def test_callbacks_see_steps_epochs_and_checkpoints(tmp_path: Path) -> None:
    class Recorder(Callback):
        def __init__(self) -> None:
            self.calls: list[tuple[str, Any]] = []

        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            self.calls.append(("step", step))
            if logs["loss"] is not None:
                self.calls.append(("loss", step))

        def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
            self.calls.append(("epoch", epoch))

        def on_checkpoint(self, info: Any) -> None:
            self.calls.append(("checkpoint", info.step))

    recorder = Recorder()
    model = mlp()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(classification_data(160), batch_size=8), epochs=2, precision="fp32",
        device="cpu", progress=False, checkpoint=tmp_path, checkpoint_every_steps=15,
        callbacks=[recorder])
    assert [call for call in recorder.calls if call[0] == "epoch"] == [("epoch", 0), ("epoch", 1)]
    assert [step for kind, step in recorder.calls if kind == "step"] == list(range(1, 41))
    read = [step for kind, step in recorder.calls if kind == "loss"]
    assert read == [10, 20, 30, 40]  # the loss is read every log_every=10 steps
    checkpoints = [step for kind, step in recorder.calls if kind == "checkpoint"]
    assert checkpoints == [15, 30, 40]  # each once written, the last one included


def test_reduce_on_plateau_steps_on_the_validation_loss() -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)  # no real progress: a plateau
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
    data = DataLoader(classification_data(64), batch_size=32)
    fit(model, optimizer, data, epochs=3, val_data=data, scheduler=scheduler,
        precision="fp32", device="cpu", progress=False)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-12 * 0.25)  # halved twice


def test_the_loader_fits_this_machine() -> None:
    made = loader(classification_data(32), batch_size=4)
    assert made.num_workers == 1  # a 2-core machine: one worker beside the kernel
    assert made.persistent_workers is True and made.pin_memory is False
    assert loader(classification_data(32), 4, num_workers=0).num_workers == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"model": "not a model"}, TypeError, "model must be a torch.nn.Module"),
        ({"optimizer": None}, TypeError, "optimizer must be a torch.optim.Optimizer"),
        ({"train_data": 5}, TypeError, "train_data must be a DataLoader or an iterable"),
        ({"train_data": []}, ValueError, "train_data is empty"),
        ({"train_data": iter(())}, ValueError, "train_data is empty"),
        ({"epochs": 2, "max_steps": 10}, ValueError, "give epochs or max_steps, not both"),
        ({"epochs": 0}, ValueError, "epochs must be a positive integer"),
        ({"grad_accum": 1.5}, ValueError, "grad_accum must be a positive integer"),
        ({"precision": "fp8"}, ValueError, "unknown precision 'fp8'"),
        ({"checkpoint_every": "soon"}, ValueError, "'soon' is not a duration"),
        ({"checkpoint_every": True}, TypeError, "checkpoint_every is a duration such as '10m' "
                                                "or a number of seconds, not True; to save every "
                                                "N steps, pass checkpoint_every_steps=N"),
        ({"checkpoint_every": 0}, TypeError, "checkpoint_every is a duration"),
        ({"checkpoint_every": "10m", "checkpoint_every_steps": 5}, ValueError,
         "give checkpoint_every (a duration) or checkpoint_every_steps (a number of steps), "
         "not both"),
        ({"checkpoint_every_steps": "5"}, ValueError, "checkpoint_every_steps must be a number "
                                                      "of optimizer steps >= 1, not '5'"),
        ({"clip_grad_norm": "1.0"}, ValueError, "clip_grad_norm must be a positive number"),
        ({"seed": 1.5}, ValueError, "seed must be a whole number from 0 to 2**53, not 1.5"),
        ({"seed": 2**53 + 1}, ValueError, "seed must be a whole number from 0 to 2**53, not "
                                          "9007199254740993"),
        ({"checkpoint": 3}, TypeError, "checkpoint must be a folder or a CheckpointManager"),
        ({"loss_fn": None, "train_data": [(torch.randn(4, 8), torch.randn(4, 4))]},
         ValueError, "cannot tell which loss fits outputs (4, 4) and targets (4, 4) "
                     "torch.float32: pass loss_fn="),
        ({"resume": True, "checkpoint": "{tmp}/empty"}, ValueError, "nothing to resume from"),
    ],
)
def test_bad_input_gets_a_clear_error(tmp_path: Path, kwargs: dict[str, Any], error: type,
                                      message: str) -> None:
    model = mlp()
    arguments: dict[str, Any] = {
        "model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "train_data": DataLoader(classification_data(32), batch_size=8), "device": "cpu",
        "progress": False, "precision": "fp32"}
    for key, value in kwargs.items():
        arguments[key] = value.format(tmp=tmp_path) if isinstance(value, str) and "{tmp}" in \
            value else value
    with pytest.raises(error) as caught:
        fit(**arguments)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("every", "every_steps", "schedule"), [
    (None, None, (600.0, None)),  # ten minutes by default
    ("10m", None, (600.0, None)),
    (600, None, (600.0, None)),  # a number is seconds, never steps
    (1.5, None, (1.5, None)),
    (None, 600, (None, 600)),
])
def test_periodic_saves_are_a_duration_or_a_number_of_steps(
        every: Any, every_steps: Any, schedule: tuple[float | None, int | None]) -> None:
    assert checkpoint_schedule(every, every_steps) == schedule


def test_checkpoint_every_is_a_duration_even_as_a_number(tmp_path: Path) -> None:
    """A number is seconds: an hour is not due in a short run, which is saved at its end."""
    model = mlp()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(classification_data(samples=40), batch_size=8), epochs=2, device="cpu",
        progress=False, checkpoint=CheckpointManager(tmp_path, keep_last=10),
        checkpoint_every=3600.0)
    assert [info.step for info in CheckpointManager(tmp_path).list()] == [10]


@pytest.mark.parametrize(("drop_last", "every", "saved"), [
    (False, 3, [3, 6]),  # 20 samples in batches of 8: 8, 8, 4
    (True, 2, [2, 4]),  # 8, 8 (the last 4 dropped)
    (True, 3, [3, 4]),  # the run's last step, not due, saved at its end
])
def test_each_step_is_saved_once_when_a_save_is_due_at_an_epochs_last_step(
        tmp_path: Path, drop_last: bool, every: int, saved: list[int]) -> None:
    data = DataLoader(classification_data(samples=20), batch_size=8, shuffle=True,
                      drop_last=drop_last)
    model = mlp()
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=2, device="cpu",
        progress=False, checkpoint=CheckpointManager(tmp_path, keep_last=10),
        checkpoint_every_steps=every)
    assert [info.step for info in CheckpointManager(tmp_path).list()] == saved
