"""Numeric precision for training: fp32, bf16 autocast, or fp16 autocast with a GradScaler."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


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
        import torch

        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]
        if device.type == "xla":
            from ipycloud.runtime.train import xla

            return xla.autocast(dtype)
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=dtype)

    def scaler(self, device: Any) -> Any:
        """A GradScaler for fp16 on ``device``, or None."""
        import torch

        return torch.amp.GradScaler(device.type) if self.uses_scaler else None


def resolve_precision(precision: str, device: Any, device_kind: str) -> Precision:
    """Turn "auto" into bf16 where the device runs it, else fp16 on CUDA, else fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device_kind == "xla":
        raise ValueError("fp16 is not used on XLA devices: use precision='bf16' or 'fp32'")
    if precision != "auto":
        return Precision(precision, "as requested")
    if device_kind == "cuda":
        import torch

        if torch.cuda.is_bf16_supported():
            return Precision("bf16", "the GPU runs bfloat16 natively")
        return Precision("fp16", "the GPU has no native bfloat16: fp16 with loss scaling")
    if device_kind == "xla":
        return Precision("bf16", "XLA devices run bfloat16 natively")
    if device_kind == "cpu" and _cpu_has_bf16():
        return Precision("bf16", "the CPU has bfloat16 instructions (AVX512-BF16 or AMX)")
    return Precision("fp32", f"this {device_kind} has no fast bfloat16 or float16 path")


def _cpu_has_bf16() -> bool:
    """Whether /proc/cpuinfo lists bfloat16 instructions (avx512_bf16 or amx_bf16)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False
