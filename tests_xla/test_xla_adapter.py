"""The XLA adapter on torch_xla's real CPU device (PJRT_DEVICE=CPU): no part is replaced."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as metrics
from torch.utils.data import DataLoader, Subset, TensorDataset

from ipycloud.runtime.checkpoint.rng import capture_rng_states, restore_rng_states
from ipycloud.runtime.train import xla
from ipycloud.runtime.train.precision import Precision


def _count(metric: str) -> int:
    """How many times torch_xla recorded ``metric`` in this process."""
    data = metrics.metric_data(metric)
    return 0 if data is None else data[0]


def _regression_loader(samples: int = 256, batch_size: int = 32) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 8, generator=generator)
    targets = inputs @ torch.randn(8, 1, generator=generator)
    return DataLoader(TensorDataset(inputs, targets), batch_size=batch_size)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
           device: torch.device) -> Iterator[torch.Tensor]:
    """One pass as the loop runs it; yields each step's loss, still on the device."""
    for inputs, targets in xla.device_loader(loader, device):
        assert inputs.device.type == targets.device.type == "xla"
        with xla.autocast(torch.bfloat16):
            outputs = model(inputs)
            assert outputs.dtype == torch.bfloat16
            loss = torch.nn.functional.mse_loss(outputs, targets)
        loss.backward()
        xla.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        yield loss.detach()


def test_importing_the_adapter_imports_neither_torch_nor_torch_xla() -> None:
    code = ("import sys, ipycloud.runtime.train.xla as x; assert x.xla_available(); "
            "print(sorted(m for m in ('torch', 'torch_xla') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_xla_device_is_the_xla_device() -> None:
    device = xla.xla_device()
    assert device.type == "xla"
    assert torch.ones(2, device=device).device == device


def test_a_missing_torch_xla_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # what `import` finds when absent
    with pytest.raises(ImportError, match=r"ipycloud\[xla\]"):
        xla.xla_device()


def test_training_steps_lower_the_loss_and_read_it_only_when_asked() -> None:
    device = xla.xla_device()
    model = _mlp().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = _regression_loader()
    before = [parameter.detach().cpu() for parameter in model.parameters()]
    means, compiles_per_pass = [], []
    for _ in range(4):
        transfers, compiles = _count("TransferFromDeviceTime"), _count("CompileTime")
        total, steps = None, 0
        for loss in _train(model, optimizer, loader, device):
            total = loss if total is None else total + loss
            steps += 1
        assert steps == len(loader)
        assert _count("TransferFromDeviceTime") == transfers  # the steps read nothing back
        means.append(total.item() / steps)  # the one read of this progress interval
        assert _count("TransferFromDeviceTime") == transfers + 1
        compiles_per_pass.append(_count("CompileTime") - compiles)
    assert all(math.isfinite(mean) for mean in means)
    assert means == sorted(means, reverse=True) and means[-1] < means[0] / 4
    assert compiles_per_pass[-1] == 0  # same graphs every step once warmed up: no recompiling
    assert all(parameter.device.type == "xla" for parameter in model.parameters())
    after = [parameter.detach().cpu() for parameter in model.parameters()]
    assert not any(torch.equal(old, new) for old, new in zip(before, after, strict=True))


def test_autocast_is_bf16_or_nothing() -> None:
    device = xla.xla_device()
    layer = torch.nn.Linear(4, 2).to(device)
    inputs = torch.randn(3, 4, device=device)
    with xla.autocast(torch.float32):
        assert layer(inputs).dtype == torch.float32
    with xla.autocast(torch.bfloat16):
        assert layer(inputs).dtype == torch.bfloat16
    assert layer(inputs).dtype == torch.float32
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        xla.autocast(torch.float16)
    with Precision("bf16", "the loop's path").autocast(device):  # hands XLA to xla.autocast
        assert layer(inputs).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        Precision("fp16", "the loop's path").autocast(device)


def test_device_loader_passes_are_whole_and_repeatable() -> None:
    device = xla.xla_device()
    loader = _regression_loader(samples=100, batch_size=16)
    batches = xla.device_loader(loader, device)
    assert len(batches) == len(loader) == 7
    for _ in range(2):
        received = [inputs.cpu() for inputs, _ in batches]
        assert [batch.shape[0] for batch in received] == [16] * 6 + [4]
        assert torch.equal(torch.cat(received), loader.dataset.tensors[0])


class _Failing:
    """A data source whose fourth batch raises, as a broken file would."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        for index in range(10):
            if index == 3:
                raise OSError("batch 3 is unreadable")
            yield torch.full((2,), float(index))


def test_device_loader_raises_the_loader_error_after_the_batches_before_it() -> None:
    received: list[Any] = []
    with pytest.raises(OSError, match="batch 3 is unreadable"):
        for batch in xla.device_loader(_Failing(), xla.xla_device()):
            received.append(batch.cpu())
    assert [float(batch[0]) for batch in received] == [0.0, 1.0, 2.0]


def test_a_pass_left_early_stops_its_threads() -> None:
    threads = threading.active_count()
    batches = iter(xla.device_loader(_regression_loader(samples=4096, batch_size=4),
                                     xla.xla_device()))
    next(batches)
    assert threading.active_count() > threads  # the reading and uploading threads
    batches.close()  # what leaving a for loop early does, once the iterator is dropped
    assert threading.active_count() == threads


def test_to_cpu_makes_model_and_optimizer_state_loadable_without_xla(tmp_path: Path) -> None:
    device = xla.xla_device()
    model = _mlp().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in _train(model, optimizer, _regression_loader(samples=64), device):
        pass
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 2}
    on_cpu = xla.to_cpu(state)
    tensors = [value for value in on_cpu["model"].values()]
    tensors += [value for entry in on_cpu["optimizer"]["state"].values()
                for value in entry.values()]
    assert tensors and all(tensor.device.type == "cpu" for tensor in tensors)
    assert on_cpu["step"] == 2
    live_count = optimizer.state_dict()["state"][0]["step"]
    assert live_count.device.type == "cpu"  # AdamW counts on the CPU, in place
    assert on_cpu["optimizer"]["state"][0]["step"] is not live_count
    assert on_cpu["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    for name, tensor in state["model"].items():
        assert tensor.device.type == "xla"  # the live state stays where it was
        assert torch.equal(on_cpu["model"][name], tensor.cpu())

    torch.save(on_cpu, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    restored = _mlp()
    restored.load_state_dict(loaded["model"])
    restored_optimizer = torch.optim.AdamW(restored.parameters(), lr=1e-2)
    restored_optimizer.load_state_dict(loaded["optimizer"])
    inputs = torch.randn(5, 8)
    torch.testing.assert_close(restored(inputs), model(inputs.to(device)).cpu())
    exp_avg = restored_optimizer.state[next(iter(restored.parameters()))]["exp_avg"]
    assert exp_avg.device.type == "cpu" and exp_avg.abs().sum() > 0


def _resumable_run(device: torch.device, start: dict[str, Any], loaders: list[DataLoader],
                   save_at: set[int | str], model_state: dict[str, Any] | None = None,
                   optimizer_state: dict[str, Any] | None = None) -> tuple[dict, dict]:
    """Train a model with dropout as the loop does, saving checkpoints after the steps in
    ``save_at`` and, with "end" in it, after each pass; returns the final parameters and the
    checkpoints (CPU state, RNG states) by step."""
    model = _mlp_with_dropout()
    if model_state is not None:
        model.load_state_dict(model_state)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    restore_rng_states(start)
    checkpoints: dict[int, Any] = {}
    step = 0

    def save() -> None:  # the order of a checkpoint save: the state, then the RNG states
        state = xla.to_cpu({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
        checkpoints[step] = (state, capture_rng_states())

    for loader in loaders:
        for _ in _train(model, optimizer, loader, device):
            step += 1
            if step in save_at:
                save()
        if "end" in save_at:
            save()
    return {name: value.cpu() for name, value in model.state_dict().items()}, checkpoints


def _mlp_with_dropout() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                               torch.nn.Linear(32, 1))


def test_checkpoints_leave_the_draws_alone_and_a_resumed_run_ends_bit_for_bit(
        tmp_path: Path) -> None:
    device = xla.xla_device()
    loader = _regression_loader(samples=128, batch_size=16)  # 8 steps an epoch
    torch_xla.sync()  # nothing pending: the draws start from a cut
    start = capture_rng_states()

    plain, _ = _resumable_run(device, start, [loader, loader], save_at=set())
    saving, checkpoints = _resumable_run(device, start, [loader, loader], save_at={3, 8, "end"})
    for name, value in plain.items():
        assert torch.equal(saving[name], value), name  # checkpointing changed no draw

    torch.save(checkpoints[3], tmp_path / "step3.pt")
    state, rng = torch.load(tmp_path / "step3.pt", weights_only=True)
    rest = DataLoader(Subset(loader.dataset, range(3 * 16, 128)), batch_size=16)
    resumed, _ = _resumable_run(device, rng, [rest, loader], save_at=set(),
                                model_state=state["model"], optimizer_state=state["optimizer"])
    for name, value in plain.items():
        assert torch.equal(resumed[name], value), name
