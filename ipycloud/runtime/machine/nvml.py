"""A thin wrapper over NVML (``pynvml``, from nvidia-ml-py) that degrades instead of raising.

NVML is initialised on the first query, never at import, and never through CUDA: querying it
does not create a CUDA context, so a fork-based multi-GPU launch still works afterwards.
Any field the driver cannot give is ``None`` (shown as n/a). The values are those of
``nvidia-smi -q``; each field names its ``nvidia-smi --query-gpu`` equivalent.
"""

from __future__ import annotations

import contextlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, Generic, NamedTuple, TypeVar

import psutil

T = TypeVar("T")


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (``nvidia-smi --query-compute-apps``)."""

    pid: int
    name: str | None
    used_memory: int | None  # bytes


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU partitioned with Multi-Instance GPU."""

    uuid: str | None
    memory_total: int | None  # bytes


NATIVE_BF16_MAJOR = 8  # compute capability 8.0 (Ampere) and newer; older GPUs emulate it


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML sees it at the moment of the query."""

    index: int  # CUDA ordinal in this process, after CUDA_VISIBLE_DEVICES
    nvml_index: int  # index: nvidia-smi's numbering (PCI bus order)
    name: str | None  # name
    uuid: str | None  # uuid
    pci_bus_id: str | None  # pci.bus_id
    memory_total: int | None  # memory.total, bytes
    memory_used: int | None  # memory.used, bytes
    memory_free: int | None  # memory.free, bytes
    utilization_gpu: int | None  # utilization.gpu, percent
    utilization_memory: int | None  # utilization.memory, percent
    temperature_c: int | None  # temperature.gpu
    power_draw_w: float | None  # power.draw
    power_limit_w: float | None  # enforced.power.limit
    clock_sm_mhz: int | None  # clocks.sm
    clock_sm_max_mhz: int | None  # clocks.max.sm
    clock_memory_mhz: int | None  # clocks.mem
    clock_memory_max_mhz: int | None  # clocks.max.mem
    compute_capability: str | None  # compute_cap, e.g. "8.0"
    mig_enabled: bool | None  # mig.mode.current
    mig_devices: tuple[MigDevice, ...]
    processes: tuple[GpuProcess, ...] | None  # None when the driver cannot list them

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability as numbers, (8, 0) for "8.0"; None when unknown."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def supports_bf16(self) -> bool | None:
        """Native bfloat16 needs compute capability 8.0 (Ampere) or newer."""
        if self.capability is None:
            return None
        return self.capability[0] >= NATIVE_BF16_MAJOR


@dataclass(frozen=True)
class GpuSnapshot:
    """Every GPU visible to this process, the driver, and why NVML was unusable if it was."""

    driver_version: str | None  # driver_version
    cuda_driver_version: str | None  # highest CUDA version the driver supports
    devices: tuple[GpuInfo, ...]
    hidden: int  # GPUs on the machine that CUDA_VISIBLE_DEVICES hides from this process
    unavailable_reason: str | None  # None when NVML answered

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return asdict(self)


class NvmlUnavailable(Exception):
    """NVML cannot be used here (no driver, no library, no GPU): the message says why."""


_lock = threading.Lock()
_module: ModuleType | None = None
_failure: str | None = None
_generation = 0  # successful nvmlInit calls so far: handles from an earlier one may be stale


def _nvml() -> ModuleType:
    """The initialised pynvml module; initialises NVML on first use and remembers a failure."""
    global _module, _failure, _generation
    with _lock:
        if _module is not None:
            return _module
        if _failure is not None:
            raise NvmlUnavailable(_failure)
        try:
            import pynvml
        except ImportError:
            _failure = "nvidia-ml-py is not installed: pip install nvidia-ml-py"
            raise NvmlUnavailable(_failure) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            _failure = f"NVML unavailable: {_decode(str(error))}"
            raise NvmlUnavailable(_failure) from None
        except OSError as error:  # a broken libnvidia-ml that fails to load
            _failure = f"NVML unavailable: {error}"
            raise NvmlUnavailable(_failure) from None
        _module = pynvml
        _generation += 1
        return _module


def shutdown() -> None:
    """Release NVML; the next query initialises it again."""
    global _module, _failure
    with _lock:
        if _module is not None:
            with contextlib.suppress(_module.NVMLError):
                _module.nvmlShutdown()
        _module = None
        _failure = None


def _decode(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _query(nvml: ModuleType, function: Callable[..., T], *args: Any) -> T | None:
    """Call an NVML function; None for anything the driver cannot answer."""
    try:
        return function(*args)
    except nvml.NVMLError:
        return None


def _cuda_version(code: int | None) -> str | None:
    """NVML's CUDA driver version integer (12040) as text ("12.4")."""
    if code is None:
        return None
    return f"{code // 1000}.{code % 1000 // 10}"


def visible_nvml_indices(
    cuda_visible_devices: str | None,
    uuids: Sequence[str | None],
    mig_uuids: Sequence[Sequence[str]],
) -> list[int]:
    """NVML indices in CUDA ordinal order under CUDA_VISIBLE_DEVICES, as CUDA parses it.

    Entries are ordinals, GPU UUIDs (a unique prefix is enough, as in CUDA) or MIG UUIDs,
    separated by commas. CUDA stops at the first entry it cannot resolve or has seen
    already, so the devices before it stay visible and the rest are hidden.
    """
    if cuda_visible_devices is None:
        return list(range(len(uuids)))
    order: list[int] = []
    for token in (part.strip() for part in cuda_visible_devices.split(",")):
        found = _resolve_device_token(token, uuids, mig_uuids)
        if found is None or found in order:
            break
        order.append(found)
    return order


def _resolve_device_token(
    token: str, uuids: Sequence[str | None], mig_uuids: Sequence[Sequence[str]]
) -> int | None:
    if token.isdigit():
        ordinal = int(token)
        return ordinal if ordinal < len(uuids) else None
    if token.startswith("MIG-"):
        hits = [i for i, instances in enumerate(mig_uuids) if token in instances]
    elif token.startswith("GPU-"):
        hits = [i for i, uuid in enumerate(uuids) if uuid and uuid.startswith(token)]
    else:
        return None
    return hits[0] if len(hits) == 1 else None


def snapshot(with_processes: bool = True) -> GpuSnapshot:
    """Query every GPU visible to this process. Never raises: without NVML it says why."""
    try:
        nvml = _nvml()
    except NvmlUnavailable as error:
        return GpuSnapshot(None, None, (), 0, str(error))
    found = _look_up(nvml)
    devices = tuple(
        _device(nvml, found.handles[nvml_index], cuda_index, nvml_index, found.uuids[nvml_index],
                found.mig_modes[nvml_index], found.migs[nvml_index], with_processes)
        for cuda_index, nvml_index in enumerate(found.order)
    )
    return GpuSnapshot(
        driver_version=_text(nvml, nvml.nvmlSystemGetDriverVersion),
        cuda_driver_version=_cuda_version(_query(nvml, nvml.nvmlSystemGetCudaDriverVersion)),
        devices=devices,
        hidden=len(found.handles) - len(found.order),
        unavailable_reason=None,
    )


class _Devices(NamedTuple):
    """Every GPU on the machine, by NVML index, and which of them this process sees."""

    handles: list[Any]
    uuids: list[str | None]
    mig_modes: list[bool | None]  # MIG enabled; None when the driver cannot tell
    migs: list[tuple[MigDevice, ...]]
    order: list[int]  # NVML indices in CUDA ordinal order, after CUDA_VISIBLE_DEVICES


def _look_up(nvml: ModuleType) -> _Devices:
    count = _query(nvml, nvml.nvmlDeviceGetCount) or 0
    handles = [_query(nvml, nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
    uuids = [_text(nvml, nvml.nvmlDeviceGetUUID, handle) for handle in handles]
    mig_modes = [_mig_enabled(nvml, handle) for handle in handles]
    migs = [_mig_devices(nvml, handle) if enabled else ()
            for handle, enabled in zip(handles, mig_modes, strict=True)]
    order = visible_nvml_indices(
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        uuids,
        [[mig.uuid for mig in instances if mig.uuid] for instances in migs],
    )
    return _Devices(handles, uuids, mig_modes, migs, order)


def _text(nvml: ModuleType, function: Callable[..., Any], *args: Any) -> str | None:
    value = _query(nvml, function, *args)
    return None if value is None else _decode(value)


def _scaled(value: float | None, divisor: float) -> float | None:
    return None if value is None else value / divisor


class LiveFigures(NamedTuple):
    """The figures of a GPU that change from moment to moment; None where it gives none."""

    memory_total: int | None  # bytes
    memory_used: int | None  # bytes
    memory_free: int | None  # bytes
    utilization_gpu: int | None  # percent
    utilization_memory: int | None  # percent
    temperature_c: int | None
    power_draw_w: float | None


class LiveGpu(NamedTuple):
    """One GPU's live figures with what identifies it, as ``GpuReader.read()`` gives them."""

    cuda_index: int  # the CUDA ordinal as this process sees it
    name: str
    power_limit_w: float | None
    figures: LiveFigures


def _live(nvml: ModuleType, handle: Any) -> LiveFigures:
    """Memory, utilisation, temperature and power draw: four NVML calls."""
    memory = _query(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    rates = _query(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    return LiveFigures(
        memory_total=None if memory is None else memory.total,
        memory_used=None if memory is None else memory.used,
        memory_free=None if memory is None else memory.free,
        utilization_gpu=None if rates is None else rates.gpu,
        utilization_memory=None if rates is None else rates.memory,
        temperature_c=_query(nvml, nvml.nvmlDeviceGetTemperature, handle,
                             nvml.NVML_TEMPERATURE_GPU),
        power_draw_w=_scaled(_query(nvml, nvml.nvmlDeviceGetPowerUsage, handle), 1000),
    )


def _device(
    nvml: ModuleType,
    handle: Any,
    cuda_index: int,
    nvml_index: int,
    uuid: str | None,
    mig_enabled: bool | None,
    mig_devices: tuple[MigDevice, ...],
    with_processes: bool,
) -> GpuInfo:
    live = _live(nvml, handle)
    pci = _query(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    capability = _query(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
    return GpuInfo(
        index=cuda_index,
        nvml_index=nvml_index,
        name=_text(nvml, nvml.nvmlDeviceGetName, handle),
        uuid=uuid,
        pci_bus_id=None if pci is None else _decode(pci.busId),
        memory_total=live.memory_total,
        memory_used=live.memory_used,
        memory_free=live.memory_free,
        utilization_gpu=live.utilization_gpu,
        utilization_memory=live.utilization_memory,
        temperature_c=live.temperature_c,
        power_draw_w=live.power_draw_w,
        power_limit_w=_scaled(_query(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle), 1000),
        clock_sm_mhz=_query(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        clock_sm_max_mhz=_query(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
        clock_memory_mhz=_query(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
        clock_memory_max_mhz=_query(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle,
                                    nvml.NVML_CLOCK_MEM),
        compute_capability=None if capability is None else f"{capability[0]}.{capability[1]}",
        mig_enabled=mig_enabled,
        mig_devices=mig_devices,
        processes=_processes(nvml, handle) if with_processes else None,
    )


def _mig_enabled(nvml: ModuleType, handle: Any) -> bool | None:
    """Whether MIG is on now (``mig.mode.current``); None when the driver cannot tell."""
    mode = _query(nvml, nvml.nvmlDeviceGetMigMode, handle)
    return None if mode is None else mode[0] == nvml.NVML_DEVICE_MIG_ENABLE


def _mig_devices(nvml: ModuleType, handle: Any) -> tuple[MigDevice, ...]:
    """The MIG instances of a GPU with MIG on."""
    instances = []
    for slot in range(_query(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = _query(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:  # an empty slot answers NVML_ERROR_NOT_FOUND
            continue
        memory = _query(nvml, nvml.nvmlDeviceGetMemoryInfo, mig)
        instances.append(MigDevice(_text(nvml, nvml.nvmlDeviceGetUUID, mig),
                                   None if memory is None else memory.total))
    return tuple(instances)


def _processes(nvml: ModuleType, handle: Any) -> tuple[GpuProcess, ...] | None:
    compute = _query(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
    graphics = _query(nvml, nvml.nvmlDeviceGetGraphicsRunningProcesses, handle)
    if compute is None and graphics is None:
        return None
    by_pid = {entry.pid: entry for entry in [*(compute or ()), *(graphics or ())]}
    return tuple(
        GpuProcess(pid, _process_name(pid), entry.usedGpuMemory)
        for pid, entry in sorted(by_pid.items())
    )


def _process_name(pid: int) -> str | None:
    """The process name, or None when it lives in another PID namespace or has ended."""
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return None


Device = TypeVar("Device")
Figures = TypeVar("Figures")


class _PerInitialisation(ABC, Generic[Device, Figures]):
    """Reads every visible GPU, with what never changes looked up once per NVML
    initialisation. Never raises; () without NVML. Not thread-safe: one reader per thread."""

    def __init__(self) -> None:
        self._generation = 0  # NVML's initialisation the devices were looked up in; 0: none
        self._devices: tuple[Device, ...] = ()

    def read(self) -> tuple[Figures, ...]:
        try:
            nvml = _nvml()
        except NvmlUnavailable:
            return ()
        if self._generation != _generation:
            self._devices = self._look_up(nvml, _look_up(nvml))
            self._generation = _generation
        return tuple(self._read(nvml, device) for device in self._devices)

    @abstractmethod
    def _look_up(self, nvml: ModuleType, found: _Devices) -> tuple[Device, ...]:
        """What the readings need of each visible GPU, from NVML's lookup."""

    @abstractmethod
    def _read(self, nvml: ModuleType, device: Device) -> Figures:
        """One GPU's figures now."""


_LiveDevice = tuple[int, Any, str, "float | None"]  # CUDA ordinal, handle, name, power limit W


class GpuReader(_PerInitialisation[_LiveDevice, "LiveGpu"]):
    """Utilisation, memory, temperature and power of every visible GPU, read as cheaply as
    NVML allows: handles, names and power limits are looked up once per NVML
    initialisation; each reading then makes four NVML calls per GPU. A figure a GPU does
    not give (or a GPU that stopped answering) is None."""

    def _look_up(self, nvml: ModuleType, found: _Devices) -> tuple[_LiveDevice, ...]:
        handles = [found.handles[nvml_index] for nvml_index in found.order]
        return tuple(
            (cuda_index, handle,
             _text(nvml, nvml.nvmlDeviceGetName, handle) or f"GPU {cuda_index}",
             _scaled(_query(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle), 1000))
            for cuda_index, handle in enumerate(handles))

    def _read(self, nvml: ModuleType, device: _LiveDevice) -> LiveGpu:
        return _reading(nvml, *device)


def _reading(nvml: ModuleType, index: int, handle: Any, name: str,
             power_limit_w: float | None) -> LiveGpu:
    return LiveGpu(index, name, power_limit_w, _live(nvml, handle))


def unavailable_reason() -> str | None:
    """Why NVML cannot be used here (no library, no driver, driver not loaded), or None when
    it can. Initialises NVML on first use, as every query does."""
    try:
        _nvml()
    except NvmlUnavailable as error:
        return str(error)
    return None


class MigMemory(NamedTuple):
    """The memory of one MIG instance at the moment of the reading."""

    uuid: str | None
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes


class GpuDetail(NamedTuple):
    """What ``GpuReader`` leaves out of a GPU's reading: its UUID, the memory of its MIG
    instances and the processes holding memory on it."""

    cuda_index: int  # the CUDA ordinal as this process sees it
    uuid: str | None
    mig: tuple[MigMemory, ...]  # () without MIG
    processes: tuple[GpuProcess, ...] | None  # None when the driver cannot list them


# CUDA ordinal, handle, UUID, ((MIG UUID, MIG handle), ...)
_DetailDevice = tuple[int, Any, "str | None", tuple[tuple["str | None", Any], ...]]


class GpuDetailReader(_PerInitialisation[_DetailDevice, GpuDetail]):
    """UUIDs, MIG instance memory and compute processes of every visible GPU, in the same
    CUDA order as ``GpuReader``: a monitor reads both and joins them by ``cuda_index``.

    UUIDs and MIG handles are looked up once per NVML initialisation; each reading then
    makes one memory call per MIG instance and two process calls per GPU. ``hidden`` is
    how many GPUs CUDA_VISIBLE_DEVICES hides.
    """

    def __init__(self) -> None:
        super().__init__()
        self.hidden = 0

    def _look_up(self, nvml: ModuleType, found: _Devices) -> tuple[_DetailDevice, ...]:
        self.hidden = len(found.handles) - len(found.order)
        return tuple(
            (cuda_index, found.handles[nvml_index], found.uuids[nvml_index],
             _mig_handles(nvml, found.handles[nvml_index])
             if found.mig_modes[nvml_index] else ())
            for cuda_index, nvml_index in enumerate(found.order))

    def _read(self, nvml: ModuleType, device: _DetailDevice) -> GpuDetail:
        cuda_index, handle, uuid, migs = device
        return GpuDetail(cuda_index, uuid,
                         tuple(_mig_memory(nvml, mig_uuid, mig) for mig_uuid, mig in migs),
                         _processes(nvml, handle))


def _mig_handles(nvml: ModuleType, handle: Any) -> tuple[tuple[str | None, Any], ...]:
    """(UUID, handle) of each MIG instance of a GPU with MIG on."""
    slots = range(_query(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0)
    migs = (_query(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            for slot in slots)
    return tuple((_text(nvml, nvml.nvmlDeviceGetUUID, mig), mig) for mig in migs
                 if mig is not None)


def _mig_memory(nvml: ModuleType, uuid: str | None, handle: Any) -> MigMemory:
    memory = _query(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    return MigMemory(uuid, None if memory is None else memory.used,
                     None if memory is None else memory.total)
