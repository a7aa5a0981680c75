"""``precision="auto"`` on NVIDIA GPUs: bfloat16 only where the GPU runs it natively
(compute capability 8.0 and newer), fp16 with a GradScaler on older ones (Colab's T4, the
P100), where torch would emulate bfloat16 slowly.

The GPUs are faked at the module boundaries: NVML (tests/fake_nvml.py boards modelled on
the real ones) and the device queries of ``torch.cuda``, which answer as torch answers on
that GPU (bfloat16 tensors can be made on a T4: it emulates them)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fake_nvml import BOARDS, FakeBoard

from ipycloud.runtime.train.precision import resolve_precision

CUDA = torch.device("cuda", 0)


class FakeCuda:
    """``torch.cuda``'s device queries answering for one GPU; ``calls`` lists those asked
    that initialise CUDA in a real torch (all but ``is_available``)."""

    def __init__(self, name: str, capability: tuple[int, int]) -> None:
        self.name, self.capability = name, capability
        self.calls: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        answers: dict[str, Callable[..., Any]] = {
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "get_device_name": lambda device=None: self.name,
            "get_device_capability": lambda device=None: self.capability,
            "get_device_properties": lambda device=None: types.SimpleNamespace(
                name=self.name, major=self.capability[0], minor=self.capability[1]),
            # Making a bfloat16 tensor works on every CUDA GPU: before 8.0, emulated.
            "_check_bf16_tensor_supported": lambda device: True,
        }
        for name, answer in answers.items():
            monkeypatch.setattr(torch.cuda, name, self._recorded(name, answer))

    def _recorded(self, name: str, answer: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return answer(*args, **kwargs)
        return call


def on_gpu(board: Callable[[str | FakeBoard], Any], monkeypatch: pytest.MonkeyPatch,
           name: str) -> FakeCuda:
    """Fake NVML and torch.cuda as on a machine with board ``name``'s one GPU."""
    gpu = BOARDS[name].gpus[0]
    board(name)
    cuda = FakeCuda(gpu.name, gpu.capability)
    cuda.install(monkeypatch)
    return cuda


@pytest.mark.parametrize(("name", "words"), [
    ("1xT4", "Tesla T4 is compute capability 7.5"),
    ("1xP100", "Tesla P100-PCIE-16GB is compute capability 6.0"),
])
def test_a_gpu_before_ampere_gets_fp16_with_a_grad_scaler(
        board: Callable[[str | FakeBoard], Any], monkeypatch: pytest.MonkeyPatch,
        name: str, words: str) -> None:
    cuda = on_gpu(board, monkeypatch, name)
    chosen = resolve_precision("auto", CUDA, "cuda")
    assert chosen.name == "fp16" and chosen.uses_scaler
    assert chosen.reason == (f"{words}: no native bfloat16 (torch would emulate it, slowly), "
                             "so fp16 with loss scaling")
    assert isinstance(chosen.scaler(CUDA), torch.amp.GradScaler)
    assert cuda.calls == []  # NVML told: CUDA is not initialised before training


@pytest.mark.parametrize(("name", "words"), [
    ("1xA100", "NVIDIA A100-SXM4-40GB is compute capability 8.0: it runs bfloat16 natively"),
    ("1xL4", "NVIDIA L4 is compute capability 8.9: it runs bfloat16 natively"),
])
def test_an_ampere_or_newer_gpu_gets_bf16_without_a_scaler(
        board: Callable[[str | FakeBoard], Any], monkeypatch: pytest.MonkeyPatch,
        name: str, words: str) -> None:
    cuda = on_gpu(board, monkeypatch, name)
    chosen = resolve_precision("auto", CUDA, "cuda")
    assert (chosen.name, chosen.reason, chosen.uses_scaler) == ("bf16", words, False)
    assert cuda.calls == []


def test_where_nvml_cannot_tell_torch_s_compute_capability_decides(
        board: Callable[[str | FakeBoard], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    board("no-driver")  # NVML fails to load; CUDA works (a container without the library)
    cuda = FakeCuda("Tesla T4", (7, 5))
    cuda.install(monkeypatch)
    chosen = resolve_precision("auto", CUDA, "cuda")
    assert chosen.name == "fp16"
    assert chosen.reason == ("Tesla T4 is compute capability 7.5: no native bfloat16 (torch "
                             "would emulate it, slowly), so fp16 with loss scaling")
