"""Whether the installed torch can run on the GPUs here, told before anything fails.

A torch build carries machine code for a list of GPU architectures (``sm_75``) and
sometimes PTX (``compute_90``) that the driver compiles for newer ones; it also needs a
driver that supports its CUDA version. A GPU outside that list (a P100, sm_60, under a
build for sm_75 and newer) passes ``torch.cuda.is_available()`` and then fails at its first
CUDA operation with "no kernel image is available for execution on the device". These
checks read the build's list (``torch.cuda.get_arch_list()``, which does not initialise
CUDA) and the GPU and driver as NVML sees them, and name the mismatch and the fix in one
line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ipycloud.runtime.machine.nvml import GpuInfo

COMPILE_MIN_CAPABILITY = (7, 0)  # Triton, torch.compile's GPU code generator, needs Volta+
_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)[a-z]?$")


def _parsed(arch: str) -> tuple[str, int, int] | None:
    """("sm", 8, 6) for "sm_86"; None for what is not an architecture name."""
    found = _ARCH.match(arch)
    return (found[1], int(found[2]), int(found[3])) if found else None


def has_kernels_for(arches: Sequence[str], capability: tuple[int, int]) -> bool:
    """Whether a build of ``arches`` runs on a GPU of ``capability``: machine code for
    sm_XY runs on X.Z for Z >= Y; PTX for compute_XY is compiled by the driver for X.Y and
    anything newer."""
    for kind, major, minor in filter(None, map(_parsed, arches)):
        if kind == "sm" and major == capability[0] and minor <= capability[1]:
            return True
        if kind == "compute" and (major, minor) <= capability:
            return True
    return False


def sm_name(capability: tuple[int, int]) -> str:
    """sm_60 for (6, 0)."""
    return f"sm_{capability[0]}{capability[1]}"


def gpu_problem(gpu: GpuInfo, arches: Sequence[str], torch_version: str,
                torch_cuda: str | None, driver_cuda: str | None) -> str | None:
    """What keeps a torch (its version, CUDA version and ``arches``) from running on
    ``gpu`` under a driver supporting ``driver_cuda``, in one line with its fix; None when
    nothing does, or nothing can be told."""
    name, capability = gpu.name or f"GPU {gpu.index}", gpu.capability
    if torch_cuda is None:
        return None  # a CPU build: nothing runs on any GPU, which is said elsewhere
    driver = _major(driver_cuda)
    if driver is not None and driver < (_major(torch_cuda) or 0):
        return (f"this torch {torch_version} is built for CUDA {torch_cuda} and the NVIDIA "
                f"driver here supports CUDA {driver_cuda} at most: install a torch built "
                f"for CUDA {driver_cuda} or older (https://pytorch.org/get-started/"
                "previous-versions/), or update the driver")
    if capability is None or not arches or has_kernels_for(arches, capability):
        return None
    built = sorted(filter(None, map(_parsed, arches)), key=lambda arch: arch[1:])
    span = f"{built[0][0]}_{built[0][1]}{built[0][2]} to {built[-1][0]}_{built[-1][1]}" \
           f"{built[-1][2]}" if built else "no GPU"
    fix = (f"install a torch built with {sm_name(capability)} kernels (PyTorch's CUDA 12.6 "
           "wheels: pip install torch --index-url https://download.pytorch.org/whl/cu126), "
           "or pick a newer GPU (a T4 or an L4)"
           if built and capability < built[0][1:] else
           f"install a newer torch, built for {sm_name(capability)}")
    return (f"this torch {torch_version} has no kernels for the {name} "
            f"({sm_name(capability)}): it was built for {span}; {fix}")


def compile_problem(gpu: str, capability: tuple[int, int]) -> str | None:
    """Why torch.compile cannot run on ``gpu``, in one line, or None."""
    if capability >= COMPILE_MIN_CAPABILITY:
        return None
    return (f"compile needs a GPU of compute capability 7.0 or newer (Triton) and the {gpu} "
            f"is {capability[0]}.{capability[1]}: leave compile off")


def _major(version: str | None) -> int | None:
    """12 for "12.8"; None for None or what is not a version."""
    head = (version or "").split(".")[0]
    return int(head) if head.isdigit() else None
