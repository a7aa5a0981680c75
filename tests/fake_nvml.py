"""A stand-in for the NVML library on a machine without an NVIDIA GPU.

It replaces the ``pynvml`` module at the module boundary: the same function names, the
real ``pynvml.NVMLError`` classes and constants, and device tables modelled on what
``nvidia-smi -q`` prints for real boards. Everything above it (ipycloud's wrapper,
CUDA_VISIBLE_DEVICES mapping, the report) runs unchanged.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml as real

MIB = 1024**2
NOT_SUPPORTED = "not supported"


@dataclass
class FakeGpu:
    """One board as NVML describes it; a field set to NOT_SUPPORTED raises NotSupported."""

    name: str
    uuid: str
    bus_id: str
    memory_total_mib: int
    memory_used_mib: int
    utilization: Any  # (gpu %, memory %) or NOT_SUPPORTED
    temperature: Any
    power_mw: Any
    power_limit_mw: Any
    clocks: Any  # {"sm": (now, max), "mem": (now, max)} or NOT_SUPPORTED
    capability: tuple[int, int]
    mig: Any = NOT_SUPPORTED  # NOT_SUPPORTED, or a list of MIG instances as (uuid, memory MiB)
    processes: Any = field(default_factory=list)  # [(pid, used MiB)] or NOT_SUPPORTED


@dataclass
class FakeBoard:
    """A machine's worth of GPUs plus the driver, or the reason nvmlInit fails."""

    gpus: list[FakeGpu]
    driver: str = "535.104.05"
    cuda_driver: int = 12020
    init_error: int | None = None  # an NVML_ERROR_* code raised by nvmlInit


def _error(code: int) -> real.NVMLError:
    return real.NVMLError(code)


def _t4(index: int = 0) -> FakeGpu:
    return FakeGpu(
        name="Tesla T4", uuid=f"GPU-6b3c9a0e-1d2f-4c55-8e7a-0f1e2d3c4b5{index}",
        bus_id=f"00000000:00:0{4 + index}.0", memory_total_mib=15360, memory_used_mib=3,
        utilization=(0, 0), temperature=43, power_mw=9_321, power_limit_mw=70_000,
        clocks={"sm": (300, 1590), "mem": (405, 5001)}, capability=(7, 5),
    )


def _a100_mig(index: int, instances: int) -> FakeGpu:
    return FakeGpu(
        name="NVIDIA A100-SXM4-40GB", uuid=f"GPU-2f1e0d9c-8b7a-4655-9443-2110fedcba9{index}",
        bus_id=f"00000000:{0x07 + index:02X}:00.0", memory_total_mib=40960, memory_used_mib=37,
        utilization=NOT_SUPPORTED,  # NVML answers N/A for utilisation while MIG is on
        temperature=31, power_mw=52_713, power_limit_mw=400_000,
        clocks={"sm": (1410, 1410), "mem": (1215, 1215)}, capability=(8, 0),
        mig=[(f"MIG-{index}a{slot}c0b1d2-e3f4-5a6b-7c8d-9e0f1a2b3c4d", 9856)
             for slot in range(instances)],
    )


def _h100(index: int) -> FakeGpu:
    return FakeGpu(
        name="NVIDIA H100 80GB HBM3", uuid=f"GPU-0a1b2c3d-4e5f-6789-abcd-ef012345678{index}",
        bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0", memory_total_mib=81559,
        memory_used_mib=1024 * index, utilization=(12 * index % 100, 5), temperature=30 + index,
        power_mw=70_000 + 1000 * index, power_limit_mw=700_000,
        clocks={"sm": (1980, 1980), "mem": (2619, 2619)}, capability=(9, 0), mig=[],
    )


def _p100() -> FakeGpu:
    return FakeGpu(
        name="Tesla P100-PCIE-16GB", uuid="GPU-3c2b1a09-8f7e-4d6c-b5a4-938271605f4e",
        bus_id="00000000:00:04.0", memory_total_mib=16384, memory_used_mib=0,
        utilization=(0, 0), temperature=36, power_mw=26_134, power_limit_mw=250_000,
        clocks={"sm": (1189, 1328), "mem": (715, 715)}, capability=(6, 0),
    )


def _a100() -> FakeGpu:
    return FakeGpu(
        name="NVIDIA A100-SXM4-40GB", uuid="GPU-7d6c5b4a-3928-4171-a605-f4e3d2c1b0a9",
        bus_id="00000000:00:04.0", memory_total_mib=40960, memory_used_mib=3,
        utilization=(0, 0), temperature=32, power_mw=54_312, power_limit_mw=400_000,
        clocks={"sm": (210, 1410), "mem": (1215, 1215)}, capability=(8, 0), mig=[],
    )


def _l4() -> FakeGpu:
    return FakeGpu(
        name="NVIDIA L4", uuid="GPU-5e4d3c2b-1a09-4f8e-97d6-c5b4a3928170",
        bus_id="00000000:00:03.0", memory_total_mib=23034, memory_used_mib=0,
        utilization=(0, 0), temperature=40, power_mw=16_287, power_limit_mw=72_000,
        clocks={"sm": (210, 2040), "mem": (405, 6251)}, capability=(8, 9),
    )


def _no_power_no_clocks() -> FakeGpu:
    return FakeGpu(
        name="Quadro P1000", uuid="GPU-9f8e7d6c-5b4a-3928-1716-051403020100",
        bus_id="00000000:01:00.0", memory_total_mib=4096, memory_used_mib=512,
        utilization=(7, 3), temperature=NOT_SUPPORTED, power_mw=NOT_SUPPORTED,
        power_limit_mw=NOT_SUPPORTED, clocks=NOT_SUPPORTED, capability=(6, 1),
        processes=NOT_SUPPORTED,
    )


BOARDS: dict[str, FakeBoard] = {
    "no-driver": FakeBoard([], init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND),
    # The library loads but the kernel module is not loaded (a container without the GPU).
    "driver-not-loaded": FakeBoard([], init_error=real.NVML_ERROR_DRIVER_NOT_LOADED),
    "no-gpu": FakeBoard([]),
    "1xT4": FakeBoard([_t4()]),
    "1xP100": FakeBoard([_p100()]),
    "1xA100": FakeBoard([_a100()]),
    "1xL4": FakeBoard([_l4()], driver="550.54.15", cuda_driver=12040),
    "2xA100-MIG": FakeBoard([_a100_mig(0, 3), _a100_mig(1, 2)], driver="525.85.12",
                            cuda_driver=12000),
    "8xH100": FakeBoard([_h100(i) for i in range(8)], driver="550.54.15", cuda_driver=12040),
    "no-power-clocks": FakeBoard([_no_power_no_clocks()], driver="470.239.06",
                                 cuda_driver=11040),
}


def with_processes(gpu: FakeGpu, processes: list[tuple[int, int]]) -> FakeGpu:
    """A copy of ``gpu`` with the given (pid, MiB) compute processes."""
    return replace(gpu, processes=processes)


def build_module(board: FakeBoard) -> types.ModuleType:
    """A module with pynvml's interface answering from ``board``."""
    module = types.ModuleType("pynvml")
    for name in dir(real):
        if name.startswith(("NVML_", "NVMLError")):
            setattr(module, name, getattr(real, name))
    calls = {"init": 0, "shutdown": 0}
    module.calls = calls  # type: ignore[attr-defined]

    def answer(value: Any) -> Any:
        if value is NOT_SUPPORTED:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return value

    def gpu(handle: Any) -> FakeGpu:
        if not isinstance(handle, int) or not 0 <= handle < len(board.gpus):
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return board.gpus[handle]

    def init() -> None:
        calls["init"] += 1
        if board.init_error is not None:
            raise _error(board.init_error)

    def shutdown() -> None:
        calls["shutdown"] += 1

    def memory(handle: Any) -> Any:
        if isinstance(handle, tuple):  # a MIG instance
            parent, slot = handle
            total = gpu(parent).mig[slot][1] * MIB
            return types.SimpleNamespace(total=total, used=0, free=total)
        board_gpu = gpu(handle)
        total, used = board_gpu.memory_total_mib * MIB, board_gpu.memory_used_mib * MIB
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def uuid(handle: Any) -> str:
        if isinstance(handle, tuple):
            parent, slot = handle
            return gpu(parent).mig[slot][0]
        return gpu(handle).uuid

    def utilization(handle: Any) -> Any:
        gpu_percent, memory_percent = answer(gpu(handle).utilization)
        return types.SimpleNamespace(gpu=gpu_percent, memory=memory_percent)

    def clock(handle: Any, kind: int, position: int) -> int:
        key = {real.NVML_CLOCK_SM: "sm", real.NVML_CLOCK_MEM: "mem"}[kind]
        return answer(gpu(handle).clocks)[key][position]

    def handle_by_index(index: int) -> int:
        gpu(index)
        return index

    def mig_mode(handle: Any) -> list[int]:
        mig = answer(gpu(handle).mig)
        state = real.NVML_DEVICE_MIG_ENABLE if mig else real.NVML_DEVICE_MIG_DISABLE
        return [state, state]

    def mig_handle(handle: Any, slot: int) -> Any:
        if slot >= len(answer(gpu(handle).mig)):
            raise _error(real.NVML_ERROR_NOT_FOUND)
        return (handle, slot)

    def processes(handle: Any) -> list[Any]:
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mib * MIB)
                for pid, mib in answer(gpu(handle).processes)]

    def graphics_processes(handle: Any) -> list[Any]:
        answer(gpu(handle).processes)  # no desktop runs on these boards
        return []

    functions = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlSystemGetDriverVersion": lambda: board.driver,
        "nvmlSystemGetCudaDriverVersion": lambda: board.cuda_driver,
        "nvmlDeviceGetCount": lambda: len(board.gpus),
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetName": lambda handle: gpu(handle).name,
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetPciInfo": lambda handle: types.SimpleNamespace(busId=gpu(handle).bus_id),
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetUtilizationRates": utilization,
        "nvmlDeviceGetTemperature": lambda handle, sensor: answer(gpu(handle).temperature),
        "nvmlDeviceGetPowerUsage": lambda handle: answer(gpu(handle).power_mw),
        "nvmlDeviceGetEnforcedPowerLimit": lambda handle: answer(gpu(handle).power_limit_mw),
        "nvmlDeviceGetCudaComputeCapability": lambda handle: gpu(handle).capability,
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda handle: 7 if answer(gpu(handle).mig) else 0,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetComputeRunningProcesses": processes,
        "nvmlDeviceGetGraphicsRunningProcesses": graphics_processes,
        "nvmlDeviceGetClockInfo": lambda handle, kind: clock(handle, kind, 0),
        "nvmlDeviceGetMaxClockInfo": lambda handle, kind: clock(handle, kind, 1),
    }
    for name, function in functions.items():
        setattr(module, name, function)
    return module
