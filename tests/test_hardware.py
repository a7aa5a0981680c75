"""The host probe on this real machine, and how container limits change what it reports."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from cgroup_files import make_v2

from ipycloud.runtime.machine.cgroup import CgroupLimits, read_cgroup_limits
from ipycloud.runtime.machine.platform import detect_platform
from ipycloud.runtime.machine.snapshot import probe_disk, probe_disks, probe_host, take_snapshot
from ipycloud.runtime.machine.software import TorchInfo
from ipycloud.runtime.monitor.probe import Probe

GIB = 1024**3


def meminfo_total() -> int:
    """MemTotal from /proc/meminfo, read independently of the code under test."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def test_host_on_this_machine() -> None:
    host = probe_host(CgroupLimits(None, None, None, None))
    assert host.memory_total == meminfo_total()
    assert host.cpu_logical == os.cpu_count()
    assert host.cpu_usable == len(os.sched_getaffinity(0))
    assert host.memory_usable == host.memory_total
    assert 0 < host.memory_free <= host.memory_total


def test_a_container_limit_is_what_the_kernel_gets() -> None:
    limits = CgroupLimits(version=2, memory_limit=2 * GIB, memory_usage=GIB + GIB // 2,
                          cpu_limit=0.5)
    host = probe_host(limits)
    assert host.memory_usable == 2 * GIB
    assert host.memory_free == GIB // 2
    assert host.cpu_usable == 0.5
    assert host.memory_total == meminfo_total()  # the host's figure stays visible


def test_usage_above_the_limit_leaves_nothing_free() -> None:
    host = probe_host(CgroupLimits(2, GIB, 2 * GIB, None))
    assert host.memory_free == 0


def test_the_report_and_the_sampler_agree_on_the_containers_memory(tmp_path: Path) -> None:
    """Both count the working set as used: page cache the kernel can drop does not count."""
    make_v2(tmp_path, {"memory.max": f"{GIB}\n", "memory.current": f"{GIB // 2}\n",
                       "memory.stat": f"inactive_file {GIB // 4}\n"})
    host = probe_host(read_cgroup_limits(tmp_path))
    sample = Probe(root=tmp_path).read()
    assert host.cgroup.memory_usage == sample.ram_used == GIB // 4
    assert host.memory_usable == sample.ram_limit == min(GIB, host.memory_total)
    assert host.memory_free == sample.ram_available == GIB * 3 // 4  # the host has more free


def test_a_missing_folder_has_no_disk_figures(tmp_path: Path) -> None:
    missing = probe_disk("persistent", tmp_path / "drive" / "MyDrive")
    assert (missing.total, missing.free) == (None, None)
    present = probe_disk("scratch", tmp_path)
    assert present.total is not None and 0 < present.free <= present.total
    statvfs = os.statvfs(tmp_path)
    assert present.total == statvfs.f_blocks * statvfs.f_frsize


def test_disks_list_each_folder_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    platform = dataclasses.replace(detect_platform({"HOME": str(tmp_path)}, tmp_path),
                                   scratch_dir=tmp_path)
    disks = probe_disks(platform)
    assert [(disk.role, disk.path) for disk in disks] == [("working", str(tmp_path))]


def test_bf16_needs_ampere_and_a_cuda_build_of_torch(board) -> None:
    board("2xA100-MIG")
    snapshot = take_snapshot()
    cuda_torch = dataclasses.replace(snapshot.software.torch, cuda_runtime="12.1")
    with_cuda = dataclasses.replace(snapshot, software=dataclasses.replace(
        snapshot.software, torch=cuda_torch))
    assert with_cuda.bf16_supported is True
    cpu_torch = dataclasses.replace(snapshot.software, torch=TorchInfo(*[None] * 6))
    assert dataclasses.replace(snapshot, software=cpu_torch).bf16_supported is False
    board("1xT4")
    turing = take_snapshot()
    assert dataclasses.replace(turing, software=with_cuda.software).bf16_supported is False
    board("no-driver")
    assert take_snapshot().bf16_supported is None


def test_snapshot_to_dict_adds_the_derived_figures() -> None:
    data = take_snapshot().to_dict()
    assert data["host"]["memory_usable"] <= data["host"]["memory_total"]
    assert set(data) == {"platform", "host", "disks", "gpus", "software", "bf16_supported",
                         "build_problems"}
