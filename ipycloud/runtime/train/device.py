"""Which device to train on, and why: CUDA, then XLA, then Apple MPS, then the CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ipycloud.runtime.train.xla import xla_available, xla_device


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
    from ipycloud.runtime import nvml

    gpus = nvml.snapshot(with_processes=False).devices
    if gpus and torch.version.cuda is not None:
        return DeviceChoice(torch.device("cuda", 0), "cuda",
                            f"{len(gpus)} NVIDIA GPU(s) visible, first: {gpus[0].name}")
    if xla_available():

        return DeviceChoice(xla_device(), "xla", "torch_xla is installed")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return DeviceChoice(torch.device("mps"), "mps", "Apple GPU through Metal")
    reason = "no GPU" + ("" if gpus else " visible") + ", no torch_xla, no MPS"
    if gpus:
        reason = "GPUs are visible but this torch has no CUDA build"
    return DeviceChoice(torch.device("cpu"), "cpu", reason)
