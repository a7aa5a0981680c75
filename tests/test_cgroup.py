"""read_cgroup and read_cgroup_limits on fake cgroup trees under tmp_path, laid out as the
kernel shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cgroup_files import make_v1, make_v2, write

from ipycloud.runtime.machine.cgroup import (
    CgroupLimits,
    ContainerMemory,
    container_memory,
    read_cgroup,
    read_cgroup_limits,
)

MIB = 2**20
GIB = 2**30
V1_NO_LIMIT = "9223372036854771712\n"  # what cgroup v1 writes for "unlimited"


def test_v2_container_limits(tmp_path: Path) -> None:
    make_v2(tmp_path, {"memory.max": "4294967296\n", "memory.current": "123456789\n",
                      "cpu.max": "200000 100000\n"})
    assert read_cgroup_limits(tmp_path) == CgroupLimits(
        version=2, memory_limit=4 * GIB, memory_usage=123456789, cpu_limit=2.0
    )


def test_v2_unlimited(tmp_path: Path) -> None:
    make_v2(tmp_path, {"memory.max": "max\n", "cpu.max": "max 100000\n"})
    limits = read_cgroup_limits(tmp_path)
    assert limits.version == 2
    assert limits.memory_limit is None
    assert limits.cpu_limit is None


def test_v2_nested_takes_the_tightest_level(tmp_path: Path) -> None:
    # The parent caps memory harder than the leaf; the leaf caps CPU harder than the parent.
    make_v2(
        tmp_path,
        {
            "user.slice/memory.max": f"{GIB}\n",
            "user.slice/cpu.max": "300000 100000\n",
            "user.slice/memory.current": "999\n",
            "user.slice/job.scope/memory.max": f"{2 * GIB}\n",
            "user.slice/job.scope/cpu.max": "150000 100000\n",
            "user.slice/job.scope/memory.current": "4096\n",
        },
        self_path="/user.slice/job.scope",
    )
    assert read_cgroup_limits(tmp_path) == CgroupLimits(
        version=2, memory_limit=GIB, memory_usage=4096, cpu_limit=1.5
    )


def test_v2_path_cannot_climb_out_of_the_mount(tmp_path: Path) -> None:
    make_v2(tmp_path, {"memory.max": f"{GIB}\n"}, self_path="/../../../etc")
    write(tmp_path, "etc/memory.max", "1\n")
    assert read_cgroup_limits(tmp_path).memory_limit == GIB


def test_v1_limits_from_the_process_controller_path(tmp_path: Path) -> None:
    make_v1(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", {
        "memory/memory.limit_in_bytes": V1_NO_LIMIT,
        "memory/docker/abc/memory.limit_in_bytes": "536870912\n",
        "memory/docker/abc/memory.usage_in_bytes": "1048576\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert read_cgroup_limits(tmp_path) == CgroupLimits(
        version=1, memory_limit=512 * 2**20, memory_usage=1048576, cpu_limit=1.5
    )


def test_v1_unlimited(tmp_path: Path) -> None:
    make_v1(tmp_path, "4:memory:/\n2:cpu:/\n", {
        "memory/memory.limit_in_bytes": V1_NO_LIMIT,
        "memory/memory.usage_in_bytes": "2048\n",
        "cpu/cpu.cfs_quota_us": "-1\n",
        "cpu/cpu.cfs_period_us": "100000\n",
    })
    assert read_cgroup_limits(tmp_path) == CgroupLimits(
        version=1, memory_limit=None, memory_usage=2048, cpu_limit=None
    )


def test_no_cgroup_file_system(tmp_path: Path) -> None:
    assert read_cgroup_limits(tmp_path) == CgroupLimits(
        version=None, memory_limit=None, memory_usage=None, cpu_limit=None
    )


@pytest.mark.parametrize("junk", ["banana\n", "", "12 34 56\n", b"\x00\xff\xfe junk"])
def test_v2_garbage_gives_none(tmp_path: Path, junk: str | bytes) -> None:
    make_v2(tmp_path, {"memory.max": junk, "memory.current": junk, "cpu.max": junk})
    write(tmp_path, "proc/self/cgroup", b"\x00\xffnot a cgroup file")
    assert read_cgroup_limits(tmp_path) == CgroupLimits(
        version=2, memory_limit=None, memory_usage=None, cpu_limit=None
    )


def test_v1_garbage_and_folders_in_place_of_files_give_none(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "garbage without colons\n")
    (tmp_path / "sys/fs/cgroup/memory/memory.limit_in_bytes").mkdir(parents=True)
    write(tmp_path, "sys/fs/cgroup/memory/memory.usage_in_bytes", b"\xff\xfe")
    write(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "abc\n")
    write(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_period_us", "0\n")
    assert read_cgroup_limits(tmp_path) == CgroupLimits(
        version=1, memory_limit=None, memory_usage=None, cpu_limit=None
    )


def test_to_dict_is_json_serialisable(tmp_path: Path) -> None:
    make_v2(tmp_path, {"memory.max": "4294967296\n", "cpu.max": "50000 100000\n"})
    data = json.loads(json.dumps(read_cgroup_limits(tmp_path).to_dict()))
    assert data == {"version": 2, "memory_limit": 4 * GIB, "memory_usage": None, "cpu_limit": 0.5}


def test_v2_usage_is_read_at_each_call_from_the_nearest_level(tmp_path: Path) -> None:
    make_v2(tmp_path, {
        "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n",  # only at the top
        "job.slice/memory.current": "1\n",
        "job.slice/task/memory.current": f"{700 * MIB}\n",
        "job.slice/task/memory.stat": f"active_file {100 * MIB}\ninactive_file {200 * MIB}\n",
    }, self_path="/job.slice/task")
    limits, (memory, cpu_time) = read_cgroup(tmp_path)
    assert limits.memory_usage == 500 * MIB  # the same working set, read once at the start
    assert memory is not None and cpu_time is not None
    assert memory.used() == 500 * MIB  # page cache that can be dropped does not count
    assert cpu_time.seconds() == 2.5
    write(tmp_path, "sys/fs/cgroup/job.slice/task/memory.stat", f"inactive_file {GIB}\n")
    write(tmp_path, "sys/fs/cgroup/cpu.stat", "usage_usec 3000000\n")
    assert memory.used() == 0  # never below nothing
    assert cpu_time.seconds() == 3.0
    (tmp_path / "sys/fs/cgroup/job.slice/task/memory.stat").unlink()
    assert memory.used() == 700 * MIB
    write(tmp_path, "sys/fs/cgroup/job.slice/task/memory.current", "max\n")
    write(tmp_path, "sys/fs/cgroup/cpu.stat", "user_usec 1\n")
    assert memory.used() is None and cpu_time.seconds() is None


def test_v1_usage_from_the_controller_trees(tmp_path: Path) -> None:
    make_v1(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", {
        "memory/docker/abc/memory.usage_in_bytes": f"{GIB}\n",
        "memory/docker/abc/memory.stat": f"cache {300 * MIB}\ntotal_inactive_file {256 * MIB}\n",
        "cpu,cpuacct/cpuacct.usage": "1500000000\n",  # no folder for the process: the top's
    })
    limits, (memory, cpu_time) = read_cgroup(tmp_path)
    assert memory is not None and cpu_time is not None
    assert memory.used() == limits.memory_usage == GIB - 256 * MIB
    assert cpu_time.seconds() == 1.5


@pytest.mark.parametrize("cgroup_fs", [True, False])
def test_usage_without_usage_files_has_no_readers(tmp_path: Path, cgroup_fs: bool) -> None:
    if cgroup_fs:
        make_v2(tmp_path, {"memory.max": f"{GIB}\n"})
    assert read_cgroup(tmp_path).usage == (None, None)


def test_real_machine_does_not_raise() -> None:
    limits, (memory, cpu_time) = read_cgroup()
    again = read_cgroup_limits()  # the limits are fixed; the memory in use moves with others
    assert (again.version, again.memory_limit, again.cpu_limit) == (
        limits.version, limits.memory_limit, limits.cpu_limit)
    assert limits.version in (None, 1, 2)
    assert limits.memory_limit is None or limits.memory_limit > 0
    assert memory is None or (memory.used() or 0) >= 0
    assert cpu_time is None or (cpu_time.seconds() or 0.0) >= 0


@pytest.mark.parametrize(("limit", "used", "expected"), [
    (None, 3 * GIB, ContainerMemory(6 * GIB, 16 * GIB, 10 * GIB, limited=False)),  # the host's
    (4 * GIB, 3 * GIB, ContainerMemory(3 * GIB, 4 * GIB, GIB, limited=True)),
    (4 * GIB, None, ContainerMemory(6 * GIB, 4 * GIB, 0, limited=True)),  # never below nothing
    (12 * GIB, GIB, ContainerMemory(GIB, 12 * GIB, 10 * GIB, limited=True)),  # the host's free
    (32 * GIB, GIB, ContainerMemory(GIB, 16 * GIB, 10 * GIB, limited=False)),  # above the host
])
def test_container_memory(limit: int | None, used: int | None,
                          expected: ContainerMemory) -> None:
    """A host of 16 GiB with 10 GiB available, under various cgroup limits."""
    assert container_memory(16 * GIB, 10 * GIB, limit, used) == expected
