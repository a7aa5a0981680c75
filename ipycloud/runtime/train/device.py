"""Which device to train on, and why: CUDA, then XLA, then Apple MPS, then the CPU."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ipycloud.runtime.machine.build_support import gpu_problem
from ipycloud.runtime.train.xla import xla_available, xla_device
from ipycloud.runtime.units import counted

if TYPE_CHECKING:
    from ipycloud.runtime.machine.nvml import GpuInfo

XLA_INSTALL = "pip install 'ipycloud[xla]', then device='auto' or 'xla'"


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
        try:
            chosen = torch.device(device) if not isinstance(device, torch.device) else device
        except (RuntimeError, TypeError):
            raise ValueError(_not_a_device(device)) from None
        if chosen.type == "cuda":
            _check_cuda(chosen)
        if chosen.type == "xla" and not xla_available():
            raise ValueError(f"device={str(chosen)!r} needs torch_xla: {XLA_INSTALL}")
        return DeviceChoice(chosen, chosen.type, "as requested")
    found = _gpus_and_problems()
    gpus = _usable(found)
    if gpus:
        return DeviceChoice(torch.device("cuda", 0), "cuda",
                            f"{counted(len(gpus), 'NVIDIA GPU')} visible, first: {gpus[0].name}")
    if xla_available():
        return DeviceChoice(xla_device(), "xla", "torch_xla is installed")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return DeviceChoice(torch.device("mps"), "mps", "Apple GPU through Metal")
    reason = ("GPUs are visible but this torch has no CUDA build"
              if torch.version.cuda is None and found
              else next(filter(None, (problem for _, problem in found)),
                        "no GPU visible, no torch_xla, no MPS"))
    return DeviceChoice(torch.device("cpu"), "cpu", reason)


def _not_a_device(device: Any) -> str:
    """What to give instead of ``device``, which torch does not read as a device."""
    accepted = ("device must be 'auto', 'cpu', 'cuda', 'cuda:N', 'mps', 'xla' or a "
                f"torch.device, not {device!r}")
    if isinstance(device, str) and device.lower().startswith("tpu"):
        return f"{accepted}: a TPU is an XLA device, reached through torch_xla ({XLA_INSTALL})"
    return accepted


def _check_cuda(device: Any) -> None:
    """ValueError, in one line, for a CUDA device this process cannot train on."""
    import torch

    if torch.version.cuda is None:
        raise ValueError(f"device={str(device)!r} needs CUDA, but this torch "
                         f"{torch.__version__} is a build without CUDA: use device='auto' "
                         "or 'cpu', or install a CUDA build of torch")
    found = _gpus_and_problems()
    if not found:
        raise ValueError(f"device={str(device)!r} needs an NVIDIA GPU, and none is visible: "
                         "use device='auto' or 'cpu', or pick a GPU runtime")
    if device.index is not None and device.index >= len(found):
        raise ValueError(f"device={str(device)!r}: only {counted(len(found), 'NVIDIA GPU')} "
                         f"{'is' if len(found) == 1 else 'are'} visible "
                         f"(cuda:0 to cuda:{len(found) - 1})")
    _, problem = found[device.index or 0]
    if problem is not None:
        raise ValueError(f"device={str(device)!r}: {problem}")


def usable_gpus() -> tuple[GpuInfo, ...]:
    """The NVIDIA GPUs this process can train on: those NVML sees that this torch has
    kernels for (none for a torch built without CUDA). Neither initialises CUDA."""
    return _usable(_gpus_and_problems())


def _usable(found: tuple[tuple[GpuInfo, str | None], ...]) -> tuple[GpuInfo, ...]:
    import torch

    if torch.version.cuda is None:
        return ()
    return tuple(gpu for gpu, problem in found if problem is None)


def _gpus_and_problems() -> tuple[tuple[GpuInfo, str | None], ...]:
    """Each GPU NVML sees (in CUDA's order), with what keeps this torch from running on
    it, in one line with its fix, or None: from one NVML reading."""
    import torch

    from ipycloud.runtime.machine import nvml

    found = nvml.snapshot(with_processes=False)
    arches = torch.cuda.get_arch_list()
    return tuple((gpu, gpu_problem(gpu, arches, torch.__version__, torch.version.cuda,
                                   found.cuda_driver_version)) for gpu in found.devices)


def move_to_device(model: Any, optimizer: Any, device: Any) -> Any:
    """Move ``model`` to ``device`` and point ``optimizer`` at the moved parameters.

    Moving to an XLA device makes new Parameter objects (CUDA and MPS keep the same ones),
    and an optimizer left holding the old ones would train a copy nobody uses.
    """
    before = list(model.parameters())
    model = model.to(device)
    moved = {id(old): new for old, new in zip(before, model.parameters(), strict=True)
             if old is not new}
    if moved:
        for group in optimizer.param_groups:
            group["params"] = [moved.get(id(param), param) for param in group["params"]]
        optimizer.state = defaultdict(dict, {
            moved.get(id(param), param): {key: value.to(device) if hasattr(value, "to")
                                          else value for key, value in state.items()}
            for param, state in optimizer.state.items()})
    return model
