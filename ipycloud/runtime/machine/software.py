"""Deep-learning software in this environment: torch, CUDA runtime, cuDNN, XLA/TPU, MPS.

torch is imported only when it is installed, and CUDA is never initialised: GPU
availability comes from torch's NVML-based device count, so a fork-based multi-GPU launch
still works afterwards. torch_xla is found, never imported (importing it claims the TPU).
"""

from __future__ import annotations

import glob
import os
import platform
import sys
from dataclasses import asdict, dataclass
from typing import Any

from ipycloud.runtime._optional import is_available

# Variables that TPU VMs, Colab and Kaggle TPU runtimes set.
TPU_ENVIRONMENT_VARIABLES = (
    "TPU_NAME",
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_SKIP_MDS_QUERY",
    "COLAB_TPU_ADDR",
    "XRT_TPU_CONFIG",
)
# Device files of TPU chips (v4 and newer expose /dev/accel*, v5e and v6e also /dev/vfio/*).
TPU_DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*")


@dataclass(frozen=True)
class TorchInfo:
    """What torch offers here; every field is None when torch is not installed."""

    version: str | None
    cuda_runtime: str | None  # CUDA version torch was built with (torch.version.cuda)
    cudnn: str | None  # cuDNN version torch loads, e.g. "9.1.0"
    cuda_available: bool | None  # torch sees a GPU (NVML-based, no CUDA context)
    cuda_initialized: bool | None  # whether this process has already created a CUDA context
    mps_available: bool | None  # Apple-silicon GPU through Metal


@dataclass(frozen=True)
class XlaInfo:
    """Signs of XLA and TPUs, gathered without importing torch_xla."""

    torch_xla_version: str | None  # None when torch_xla is not installed
    pjrt_device: str | None  # PJRT_DEVICE: TPU, CUDA or CPU
    tpu_environment: tuple[str, ...]  # TPU variables that are set
    tpu_device_files: tuple[str, ...]

    @property
    def tpu_present(self) -> bool:
        """A TPU is attached: device files, TPU variables, or PJRT_DEVICE=TPU."""
        return bool(self.tpu_device_files or self.tpu_environment or self.pjrt_device == "TPU")


@dataclass(frozen=True)
class SoftwareInfo:
    """Python, torch and XLA versions and capabilities."""

    python: str
    os: str
    torch: TorchInfo
    xla: XlaInfo

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        data = asdict(self)
        data["xla"]["tpu_present"] = self.xla.tpu_present
        return data


def _distribution_version(name: str) -> str | None:
    from importlib import metadata  # costs ~13 ms: only when torch_xla is installed

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cudnn_text(code: int | None) -> str | None:
    """cuDNN's integer version (90100 or 8902) as text ("9.1.0" or "8.9.2")."""
    if code is None:
        return None
    major, rest = divmod(code, 10000 if code >= 10000 else 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def probe_torch(nvml_usable: bool) -> TorchInfo:
    """Probe torch without initialising CUDA; ``nvml_usable`` says whether NVML answered.

    torch's device count goes through NVML while CUDA is uninitialised; without NVML it
    would fall back to cuInit, so then CUDA counts as unavailable without asking.
    """
    if not is_available("torch"):
        return TorchInfo(None, None, None, None, None, None)
    import torch

    cuda_built = torch.version.cuda is not None
    cuda_available = bool(cuda_built and nvml_usable and torch.cuda.device_count() > 0)
    cudnn = torch.backends.cudnn.version() if cuda_built else None
    mps = getattr(torch.backends, "mps", None)
    return TorchInfo(
        version=torch.__version__,
        cuda_runtime=torch.version.cuda,
        cudnn=_cudnn_text(cudnn),
        cuda_available=cuda_available,
        cuda_initialized=torch.cuda.is_initialized(),
        mps_available=bool(mps is not None and mps.is_available()),
    )


def probe_xla(environ: dict[str, str] | None = None) -> XlaInfo:
    """Find torch_xla, PJRT_DEVICE, TPU variables and TPU device files."""
    env = os.environ if environ is None else environ
    files = sorted(path for pattern in TPU_DEVICE_PATTERNS for path in glob.glob(pattern))
    return XlaInfo(
        torch_xla_version=_distribution_version("torch_xla") if is_available("torch_xla") else None,
        pjrt_device=env.get("PJRT_DEVICE"),
        tpu_environment=tuple(name for name in TPU_ENVIRONMENT_VARIABLES if env.get(name)),
        tpu_device_files=tuple(files),
    )


def probe_software(nvml_usable: bool) -> SoftwareInfo:
    """Python, OS, torch and XLA, as one record."""
    return SoftwareInfo(
        python=sys.version.split()[0],
        os=platform.platform(terse=True),
        torch=probe_torch(nvml_usable),
        xla=probe_xla(),
    )
