"""The NVML wrapper and the GPU part of the report, on boards modelled on real ones."""

from __future__ import annotations

import os

import psutil
import pynvml as real
import pytest
from fake_nvml import BOARDS, FakeBoard, with_processes

from ipycloud.runtime.machine import nvml
from ipycloud.runtime.machine.report import EnvironmentReport
from ipycloud.runtime.machine.snapshot import take_snapshot


def gpu_rows(report: EnvironmentReport) -> list[dict[str, str]]:
    headers, rows = report.gpu_table()
    return [dict(zip(headers, row, strict=True)) for row in rows]


def test_nvml_is_not_initialised_until_the_first_query(board) -> None:
    module = board("1xT4")
    assert module.calls["init"] == 0
    nvml.snapshot()
    nvml.snapshot()
    assert module.calls["init"] == 1


def test_without_a_driver_the_report_says_why_and_keeps_the_rest(board) -> None:
    module = board("no-driver")
    snapshot = take_snapshot()
    assert snapshot.gpus.devices == ()
    assert "NVML Shared Library Not Found" in (snapshot.gpus.unavailable_reason or "")
    text = str(EnvironmentReport(snapshot))
    assert "No NVIDIA GPU: NVML unavailable: NVML Shared Library Not Found." in text
    assert "CPU" in text and "RAM" in text and "Platform" in text
    take_snapshot()
    assert module.calls["init"] == 1  # the failure is remembered, not retried per call


def test_a_loaded_driver_with_no_device_is_reported_plainly(board) -> None:
    board("no-gpu")
    report = EnvironmentReport(take_snapshot())
    assert report.gpu_status() == "No NVIDIA GPU visible: the driver reports none."
    assert "NVIDIA driver" in dict(report.summary())


def test_t4_row_shows_what_nvidia_smi_shows(board) -> None:
    board("1xT4")
    report = EnvironmentReport(take_snapshot())
    (row,) = gpu_rows(report)
    assert row == {
        "#": "0", "Name": "Tesla T4", "Memory used / total": "3.0 MiB / 15.0 GiB (0%)",
        "Util": "0%", "Temp": "43 C", "Power draw / limit": "9 / 70 W",
        "SM clock / max": "300 / 1590 MHz", "CC": "7.5", "MIG": "n/a",
        "UUID": "GPU-6b3c9a0e-1d2f-4c55-8e7a-0f1e2d3c4b50",
    }
    assert dict(report.summary())["NVIDIA driver"] == "535.104.05 (CUDA 12.2)"
    assert report.gpu_status() == "1 NVIDIA GPU visible."
    assert report.snapshot.gpus.devices[0].supports_bf16 is False


def test_a100_with_mig_shows_instances_and_na_utilisation(board) -> None:
    module = board("2xA100-MIG")
    asked: list[object] = []
    mig_mode = module.nvmlDeviceGetMigMode
    module.nvmlDeviceGetMigMode = lambda handle: asked.append(handle) or mig_mode(handle)
    snapshot = take_snapshot()
    assert len(asked) == 2  # once per GPU
    rows = gpu_rows(EnvironmentReport(snapshot))
    assert [row["MIG"] for row in rows] == ["on, 3 instances", "on, 2 instances"]
    assert [row["Util"] for row in rows] == ["n/a", "n/a"]
    assert rows[0]["Power draw / limit"] == "53 / 400 W"
    first = snapshot.gpus.devices[0]
    assert first.mig_devices[0].memory_total == 9856 * 1024**2
    assert first.supports_bf16 is True
    assert snapshot.gpus.cuda_driver_version == "12.0"


def test_mig_uuid_in_cuda_visible_devices_selects_its_parent_gpu(board, monkeypatch) -> None:
    board("2xA100-MIG")
    second_gpu_instance = BOARDS["2xA100-MIG"].gpus[1].mig[0][0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", second_gpu_instance)
    snapshot = nvml.snapshot()
    assert [gpu.nvml_index for gpu in snapshot.devices] == [1]
    assert snapshot.devices[0].index == 0
    assert snapshot.hidden == 1


def test_eight_h100_are_listed_in_order(board) -> None:
    board("8xH100")
    report = EnvironmentReport(take_snapshot())
    rows = gpu_rows(report)
    assert [row["#"] for row in rows] == [str(i) for i in range(8)]
    assert {row["Name"] for row in rows} == {"NVIDIA H100 80GB HBM3"}
    assert rows[3]["Memory used / total"] == "3.0 GiB / 79.6 GiB (4%)"
    assert rows[7]["Temp"] == "37 C"
    assert report.gpu_status() == "8 NVIDIA GPUs visible."


@pytest.mark.parametrize(
    ("visible", "expected_nvml_indices"),
    [
        ("3,1", [3, 1]),
        ("0,9,2", [0]),  # CUDA stops at the first ordinal that does not exist
        ("2,2,5", [2]),  # ... and at a repeated one
        ("", []),
        ("-1", []),
        ("GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456785", [5]),
        ("GPU-0a1b2c3d-4e5f-6789-abcd-ef012345678", []),  # ambiguous prefix: all eight match
        ("GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456786,4", [6, 4]),
        ("GPU-ffffffff", []),
        (" 7 , 0 ", [7, 0]),
    ],
)
def test_cuda_visible_devices_by_index_and_uuid(board, monkeypatch, visible,
                                                expected_nvml_indices) -> None:
    board("8xH100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    snapshot = nvml.snapshot()
    assert [gpu.nvml_index for gpu in snapshot.devices] == expected_nvml_indices
    assert [gpu.index for gpu in snapshot.devices] == list(range(len(expected_nvml_indices)))
    assert snapshot.hidden == 8 - len(expected_nvml_indices)


def test_hidden_gpus_are_counted_in_the_report(board, monkeypatch) -> None:
    board("8xH100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    report = EnvironmentReport(take_snapshot())
    assert report.gpu_status() == "1 NVIDIA GPU visible (7 hidden by CUDA_VISIBLE_DEVICES)."
    assert gpu_rows(report)[0]["UUID"].endswith("5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    hidden_all = EnvironmentReport(take_snapshot())
    assert hidden_all.gpu_status() == "No NVIDIA GPU visible: 8 hidden by CUDA_VISIBLE_DEVICES."


def test_fields_the_driver_cannot_give_are_na(board) -> None:
    board("no-power-clocks")
    report = EnvironmentReport(take_snapshot(with_processes=True), show_processes=True)
    (row,) = gpu_rows(report)
    assert row["Power draw / limit"] == "n/a"
    assert row["SM clock / max"] == "n/a"
    assert row["Temp"] == "n/a"
    assert row["Util"] == "7%"
    assert row["Memory used / total"] == "512.0 MiB / 4.0 GiB (12%)"
    _, processes = report.process_table()
    assert processes == [("0", "n/a", "process list not supported by the driver", "n/a")]
    assert "Quadro P1000" in str(report)


def test_process_list_names_live_processes(board) -> None:
    t4 = with_processes(BOARDS["1xT4"].gpus[0], [(os.getpid(), 1200), (2**22 + 17, 300)])
    board(FakeBoard([t4]))
    report = EnvironmentReport(take_snapshot(with_processes=True), show_processes=True)
    _, rows = report.process_table()
    by_pid = {row[1]: row for row in rows}
    own = by_pid[str(os.getpid())]
    assert own[2] == psutil.Process().name() and own[3] == "1.2 GiB"
    assert by_pid[str(2**22 + 17)][2:] == ("n/a", "300.0 MiB")
    assert "GPU processes" in str(report)
    assert "GPU processes" not in str(EnvironmentReport(report.snapshot, show_processes=False))


def test_a_gpu_that_falls_off_the_bus_gives_na_not_an_exception(board) -> None:
    module = board("1xT4")

    def lost(*_args: object) -> None:
        raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)

    module.nvmlDeviceGetName = lost
    module.nvmlDeviceGetMemoryInfo = lost
    (gpu,) = nvml.snapshot().devices
    assert gpu.name is None and gpu.memory_total is None
    assert gpu.temperature_c == 43


@pytest.mark.parametrize(("code", "text"), [(12020, "12.2"), (12040, "12.4"), (11080, "11.8")])
def test_cuda_driver_version_text(board, code, text) -> None:
    board(FakeBoard([], cuda_driver=code))
    assert nvml.snapshot().cuda_driver_version == text
