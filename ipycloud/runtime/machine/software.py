"""Deep-learning software in this environment: torch, CUDA runtime, cuDNN, XLA/TPU, MPS.

A torch that is not imported yet is read from its files (see ``torch_files``), not
imported: that takes 1-2 s. CUDA is never initialised: GPU availability comes from NVML
(torch's own device count uses it too), so a fork-based multi-GPU launch still works
afterwards. torch_xla is found, never imported (importing it claims the TPU).
"""

from __future__ import annotations

import glob
import importlib
import os
import platform
import sys
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from ipycloud.runtime._optional import is_available
from ipycloud.runtime.machine.torch_files import cudnn_version, read_torch_build

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
    cuda_initialized: bool | None  # whether torch has created a CUDA context in this process
    mps_available: bool | None  # Apple-silicon GPU through Metal
    # GPU architectures the build has code for (torch.cuda.get_arch_list()); None when not
    # read (torch not imported, no GPU to check them against)
    cuda_arches: tuple[str, ...] | None = None


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


def probe_torch(nvml_gpus: int | None) -> TorchInfo:
    """Probe torch without initialising CUDA; ``nvml_gpus`` is how many GPUs NVML shows this
    process (CUDA_VISIBLE_DEVICES applied), None when NVML did not answer.

    An imported torch is asked. Otherwise its files tell (and CUDA is available when torch
    was built for CUDA and NVML shows a GPU, as torch's NVML-based device count would say);
    torch is imported only where they cannot: no readable ``version.py``, a CUDA build
    without pip's cuDNN, macOS, where only torch can tell whether MPS works, or a CUDA build
    beside a GPU, whose architectures only torch can tell. Without NVML, torch's device
    count would fall back to cuInit, so CUDA then counts as unavailable.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        if not is_available("torch"):
            return TorchInfo(None, None, None, None, None, None)
        from_files = _torch_from_files(nvml_gpus)
        if from_files is not None and not (from_files.cuda_runtime and nvml_gpus):
            return from_files
        torch = importlib.import_module("torch")
    return _torch_from_module(torch, nvml_gpus)


def _torch_from_module(torch: ModuleType, nvml_gpus: int | None) -> TorchInfo:
    """What an imported torch says of itself."""
    cuda_built = torch.version.cuda is not None
    cuda_available = bool(cuda_built and nvml_gpus is not None
                          and torch.cuda.device_count() > 0)
    cudnn = torch.backends.cudnn.version() if cuda_built else None
    mps = getattr(torch.backends, "mps", None)
    return TorchInfo(
        version=torch.__version__,
        cuda_runtime=torch.version.cuda,
        cudnn=_cudnn_text(cudnn),
        cuda_available=cuda_available,
        cuda_initialized=torch.cuda.is_initialized(),
        mps_available=bool(mps is not None and mps.is_available()),
        cuda_arches=tuple(torch.cuda.get_arch_list()) if cuda_built and nvml_gpus else None,
    )


def _torch_from_files(nvml_gpus: int | None) -> TorchInfo | None:
    """What an installed, not imported torch is, from its files; None where they cannot tell."""
    if sys.platform == "darwin":
        return None
    build = read_torch_build()
    if build is None:
        return None
    cudnn = None if build.cuda is None else cudnn_version()
    if build.cuda is not None and cudnn is None:
        return None
    return TorchInfo(
        version=build.version,
        cuda_runtime=build.cuda,
        cudnn=cudnn,
        cuda_available=build.cuda is not None and bool(nvml_gpus),
        cuda_initialized=False,  # not imported: no CUDA context of torch's
        mps_available=False,  # Apple's GPUs only
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


def probe_software(nvml_gpus: int | None) -> SoftwareInfo:
    """Python, OS, torch and XLA, as one record (``nvml_gpus``: see ``probe_torch``)."""
    return SoftwareInfo(
        python=sys.version.split()[0],
        os=platform.platform(terse=True),
        torch=probe_torch(nvml_gpus),
        xla=probe_xla(),
    )
