"""Numeric precision for training: fp32, bf16 autocast, or fp16 autocast with a GradScaler."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ipycloud.runtime.machine import nvml

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_NO_AUTOCAST = contextlib.nullcontext()  # reusable: it holds no state


@dataclass(frozen=True)
class Precision:
    """The resolved precision: what autocast uses and whether a GradScaler is needed."""

    name: str  # "fp32", "bf16" or "fp16"
    reason: str

    @property
    def uses_scaler(self) -> bool:
        return self.name == "fp16"

    def autocast(self, device: Any) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for one forward pass on ``device`` (XLA: ``xla.autocast``)."""
        if self.name == "fp32" and device.type != "xla":  # every step of most CPU runs
            return _NO_AUTOCAST
        import torch

        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]
        if device.type == "xla":
            from ipycloud.runtime.train import xla

            return xla.autocast(dtype)
        return torch.autocast(device_type=device.type, dtype=dtype)

    def scaler(self, device: Any) -> Any:
        """A GradScaler for fp16 on ``device``, or None."""
        import torch

        return torch.amp.GradScaler(device.type) if self.uses_scaler else None


def resolve_precision(precision: str, device: Any, device_kind: str) -> Precision:
    """Turn "auto" into bf16 where the accelerator runs it, else fp16 on CUDA, else fp32.

    CPUs get fp32: casting around every layer costs more there than bfloat16 saves, even
    on CPUs with bfloat16 instructions, for the small models notebooks train on CPUs.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device_kind == "xla":
        raise ValueError("fp16 is not used on XLA devices: use precision='bf16' or 'fp32'")
    if precision != "auto":
        return Precision(precision, "as requested")
    if device_kind == "cuda":
        name, (major, minor) = cuda_capability(device)
        gpu = f"{name} is compute capability {major}.{minor}"
        if major >= nvml.NATIVE_BF16_MAJOR:
            return Precision("bf16", f"{gpu}: it runs bfloat16 natively")
        return Precision("fp16", f"{gpu}: no native bfloat16 (torch would emulate it, "
                                 "slowly), so fp16 with loss scaling")
    if device_kind == "xla":
        return Precision("bf16", "XLA devices run bfloat16 natively")
    if device_kind == "cpu":
        return Precision("fp32", "on CPUs bf16 autocast is mostly slower than fp32; "
                                 "precision='bf16' to try it")
    return Precision("fp32", f"this {device_kind} has no fast bfloat16 or float16 path")


def cuda_capability(device: Any) -> tuple[str, tuple[int, int]]:
    """The name and compute capability of the CUDA ``device``: from NVML, which answers
    without initialising CUDA, else from torch.

    Not ``torch.cuda.is_bf16_supported()``: by default it counts emulation (True on a T4),
    and it asks about the current device, not ``device``.
    """
    index = device.index or 0
    gpu = next((gpu for gpu in nvml.snapshot(with_processes=False).devices
                if gpu.index == index), None)
    if gpu is not None and gpu.capability is not None:
        return gpu.name or f"GPU {index}", gpu.capability
    import torch

    major_minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), (int(major_minor[0]), int(major_minor[1]))
