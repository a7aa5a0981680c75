"""Which device to train on, and why: CUDA, then XLA, then Apple MPS, then the CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ipycloud.runtime.train.xla import xla_available, xla_device

if TYPE_CHECKING:
    from ipycloud.runtime.machine.nvml import GpuInfo


@dataclass(frozen=True)
class DeviceChoice:
    """The device training runs on, its kind, and the reason it was picked."""

    device: Any  # torch.device
    kind: str  # "cuda", "xla", "mps" or "cpu"
    reason: str


def choose_device(device: Any = "auto") -> DeviceChoice:
    """Resolve ``device``: "auto" picks CUDA, then XLA (torch_xla), then MPS, then CPU.

    An explicit device ("cuda:1", "cpu", a torch.device) is used as given. CUDA is found
    through NVML, so choosing does not initialise CUDA until training starts.
    """
    import torch

    if device != "auto":
        chosen = torch.device(device) if not isinstance(device, torch.device) else device
        return DeviceChoice(chosen, chosen.type, "as requested")
    gpus = usable_gpus()
    if gpus:
        return DeviceChoice(torch.device("cuda", 0), "cuda",
                            f"{len(gpus)} NVIDIA GPU(s) visible, first: {gpus[0].name}")
    if xla_available():
        return DeviceChoice(xla_device(), "xla", "torch_xla is installed")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return DeviceChoice(torch.device("mps"), "mps", "Apple GPU through Metal")
    reason = ("GPUs are visible but this torch has no CUDA build"
              if torch.version.cuda is None and _visible_gpus()
              else "no GPU visible, no torch_xla, no MPS")
    return DeviceChoice(torch.device("cpu"), "cpu", reason)


def usable_gpus() -> tuple[GpuInfo, ...]:
    """The NVIDIA GPUs this process can train on: those NVML sees, none for a torch built
    without CUDA. NVML finds them without initialising CUDA."""
    import torch

    return _visible_gpus() if torch.version.cuda is not None else ()


def _visible_gpus() -> tuple[GpuInfo, ...]:
    from ipycloud.runtime.machine import nvml

    return nvml.snapshot(with_processes=False).devices
