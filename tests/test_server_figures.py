"""The runtime's figures behind the server extension, without a server: cgroup counters
(throttling, RAM peak, OOM kills) in v2 and v1 trees, process trees of real processes with
the GPU memory NVML lists for them, GPU details on fake boards, the host probe, and why a
watched process died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest
from cgroup_files import make_v1, make_v2, write
from fake_nvml import BOARDS, FakeBoard, with_processes
from waiting import wait_for

from ipycloud.runtime.machine import nvml
from ipycloud.runtime.machine.cgroup import (
    CpuThrottling,
    read_cgroup_counters,
    throttled_percent,
)
from ipycloud.runtime.machine.nvml import GpuDetailReader, GpuProcess, MigMemory
from ipycloud.runtime.monitor.deaths import Death, before_death, explain_death
from ipycloud.runtime.monitor.host import HostProbe, HostSample
from ipycloud.runtime.monitor.processes import GpuShare, ProcessTree, TreeMeter

MIB = 2**20
GIB = 2**30
V2_EVENTS = "low 0\nhigh 0\nmax 5\noom 2\noom_kill {}\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n"


# --- cgroup counters -------------------------------------------------------------------

def test_v2_counters_where_the_quota_and_the_memory_are(tmp_path: Path) -> None:
    # The parent holds the binding CPU quota; the leaf counts the memory.
    make_v2(tmp_path, {
        "job.slice/cpu.max": "50000 100000\n",
        "job.slice/cpu.stat": "usage_usec 9\nnr_periods 200\nnr_throttled 30\n",
        "job.slice/task/cpu.max": "max 100000\n",
        "job.slice/task/cpu.stat": "usage_usec 9\nnr_periods 0\nnr_throttled 0\n",
        "job.slice/task/memory.current": f"{GIB}\n",
        "job.slice/task/memory.peak": f"{3 * GIB}\n",
        "job.slice/task/memory.events": V2_EVENTS.format(4),
    }, self_path="/job.slice/task")
    counters = read_cgroup_counters(tmp_path)
    assert counters.throttling() == CpuThrottling(200, 30)
    assert counters.memory_peak() == 3 * GIB
    assert counters.oom_kills() == 4
    write(tmp_path, "sys/fs/cgroup/job.slice/task/memory.events", V2_EVENTS.format(5))
    assert counters.oom_kills() == 5  # read at each call


def test_v1_counters(tmp_path: Path) -> None:
    make_v1(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.stat": "nr_periods 40\nnr_throttled 4\nthrottled_time 7\n",
        "memory/docker/abc/memory.usage_in_bytes": f"{GIB}\n",
        "memory/docker/abc/memory.max_usage_in_bytes": f"{2 * GIB}\n",
        "memory/docker/abc/memory.oom_control": V1_OOM_CONTROL.format(3),
    })
    counters = read_cgroup_counters(tmp_path)
    assert counters.throttling() == CpuThrottling(40, 4)
    assert (counters.memory_peak(), counters.oom_kills()) == (2 * GIB, 3)


@pytest.mark.parametrize("version", [1, 2])
def test_without_a_cpu_quota_nothing_is_throttled(tmp_path: Path, version: int) -> None:
    if version == 2:
        make_v2(tmp_path, {"cpu.max": "max 100000\n", "cpu.stat": "nr_periods 5\n"})
    else:
        make_v1(tmp_path, "2:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n",
                                        "cpu/cpu.stat": "nr_periods 5\nnr_throttled 1\n"})
    assert read_cgroup_counters(tmp_path).throttling() is None


def test_counters_of_missing_or_garbled_files_are_none(tmp_path: Path) -> None:
    assert read_cgroup_counters(tmp_path).oom_kills() is None  # no cgroup file system
    make_v2(tmp_path, {"cpu.max": "100000 100000\n", "cpu.stat": "nr_periods x\n",
                       "memory.current": "1\n", "memory.peak": "max\n",
                       "memory.events": "oom_kill\n"})
    counters = read_cgroup_counters(tmp_path)
    assert (counters.throttling(), counters.memory_peak(), counters.oom_kills()) == (
        None, None, None)


@pytest.mark.parametrize(("before", "after", "percent"), [
    (CpuThrottling(100, 5), CpuThrottling(200, 15), 10.0),
    (CpuThrottling(100, 5), CpuThrottling(100, 5), 0.0),  # no period ran: nothing held back
    (CpuThrottling(100, 5), CpuThrottling(50, 1), None),  # counters went back: a new cgroup
    (None, CpuThrottling(1, 1), None),
])
def test_throttled_percent(before: CpuThrottling | None, after: CpuThrottling,
                           percent: float | None) -> None:
    assert throttled_percent(before, after) == percent


# --- process trees ---------------------------------------------------------------------

PARENT = ("import subprocess, sys, time\n"
          "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
          "print(child.pid, flush=True)\n"
          "time.sleep(120)\n")


@pytest.fixture
def parent_and_child() -> Iterator[tuple[int, int]]:
    """A real process with a busy child; their PIDs."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    yield parent.pid, child
    os.killpg(parent.pid, signal.SIGKILL)
    parent.wait()


def test_a_tree_counts_its_descendants_and_their_gpu_memory(
        parent_and_child: tuple[int, int]) -> None:
    parent, child = parent_and_child
    meter = TreeMeter(cores=2.0)
    gpus = [(0, (GpuProcess(child, "python", 512 * MIB), GpuProcess(os.getpid(), "x", 1))),
            (1, (GpuProcess(os.getpid(), "pytest", 64 * MIB),)),
            (2, None),  # a GPU that does not list its processes
            (3, (GpuProcess(parent, "python", None),))]  # listed without its memory
    first = meter.read({"k": parent}, gpus)["k"]
    assert first.alive and first.pids == (parent, child)
    assert first.rss is not None and first.rss > 0
    assert first.cpu_percent is None  # no baseline yet
    assert first.gpu_memory == (GpuShare(0, 512 * MIB), GpuShare(3, None))
    second = wait_for(lambda: (tree := meter.read({"k": parent})["k"]).cpu_percent and tree,
                      what="the busy child's CPU use")
    assert 0 < second.cpu_percent <= 100.0


def test_an_ended_or_zombie_root_is_not_alive(parent_and_child: tuple[int, int]) -> None:
    parent, _ = parent_and_child
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: _is_zombie(zombie.pid), what="the zombie")  # ended, not yet collected
    trees = TreeMeter(cores=1.0).read({"zombie": zombie.pid, "parent": parent})
    zombie.wait()
    assert trees["zombie"] == ProcessTree(zombie.pid, alive=False, pids=(), rss=None,
                                          cpu_percent=None)
    assert trees["parent"].alive
    assert TreeMeter(cores=1.0).read({}) == {}


def _is_zombie(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- GPU details -----------------------------------------------------------------------

def test_gpu_details_of_a100s_with_mig_and_processes(board, monkeypatch) -> None:
    a100s = BOARDS["2xA100-MIG"]
    board(FakeBoard([a100s.gpus[0], with_processes(a100s.gpus[1], [(4242, 300)])]))
    reader = GpuDetailReader()
    first, second = reader.read()
    assert first.uuid == "GPU-2f1e0d9c-8b7a-4655-9443-2110fedcba90"
    assert first.mig[0] == MigMemory("MIG-0a0c0b1d2-e3f4-5a6b-7c8d-9e0f1a2b3c4d", 0, 9856 * MIB)
    assert (len(first.mig), len(second.mig), first.processes) == (3, 2, ())
    assert second.processes == (GpuProcess(4242, None, 300 * MIB),)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nvml.shutdown()  # looked up again on the next reading
    (only,) = reader.read()
    assert (only.cuda_index, only.uuid, reader.hidden) == (0, second.uuid, 1)


@pytest.mark.parametrize(("name", "reason"), [
    ("no-driver", "NVML unavailable: NVML Shared Library Not Found"),
    ("driver-not-loaded", "NVML unavailable: Driver Not Loaded"),
    ("1xT4", None),
])
def test_why_nvml_is_unavailable(board, name: str, reason: str | None) -> None:
    board(name)
    assert nvml.unavailable_reason() == reason
    assert len(GpuDetailReader().read()) == (0 if reason else 1)


# --- the host probe --------------------------------------------------------------------

@pytest.fixture
def container(tmp_path: Path) -> Path:
    """A 2 GiB, two-core cgroup v2 container; its root folder."""
    make_v2(tmp_path / "root", {
        "memory.max": f"{2 * GIB}\n", "memory.current": f"{GIB}\n",
        "memory.peak": f"{GIB + MIB}\n", "memory.events": V2_EVENTS.format(0),
        "cpu.max": "200000 100000\n",
        "cpu.stat": "usage_usec 100\nnr_periods 10\nnr_throttled 0\n"})
    return tmp_path / "root"


def test_the_host_probe_adds_what_a_shared_view_needs(
        board, container: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board(FakeBoard([with_processes(BOARDS["1xT4"].gpus[0], [(os.getpid(), 100)])]))
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    probe = HostProbe(container, home=str(tmp_path), session_start=time.time() - 3600)
    write(container, "sys/fs/cgroup/cpu.stat", "usage_usec 200\nnr_periods 30\nnr_throttled 5\n")
    sample = probe.read({"me": os.getpid()})
    assert (sample.ram_limit, sample.ram_used, sample.ram_limited) == (2 * GIB, GIB, True)
    assert (sample.ram_peak, sample.oom_kills, sample.cpu_cores) == (GIB + MIB, 0, 2.0)
    assert sample.cpu_throttled_percent == 25.0  # 5 of the 20 periods since the probe began
    assert sample.platform == "Kaggle"
    assert sample.session_left_s is not None and 11 * 3600 - 60 < sample.session_left_s <= 39600
    assert (sample.disks[0].roles[0], sample.disks[0].paths[0]) == ("home", str(tmp_path))
    assert "scratch" in {role for disk in sample.disks for role in disk.roles}
    assert sample.gpu_problem is None and sample.gpu_details[0].uuid.startswith("GPU-6b3c")
    me = sample.watched["me"]
    assert me.alive and me.gpu_memory == (GpuShare(0, 100 * MIB),)
    assert probe.read().cpu_throttled_percent == 0.0  # nothing ran in between


def test_without_a_memory_limit_ram_is_the_hosts_and_has_no_cgroup_peak(
        board, tmp_path: Path) -> None:
    board("no-gpu")
    make_v2(tmp_path, {"memory.max": "max\n", "memory.current": f"{GIB}\n",
                       "memory.peak": f"{GIB}\n", "memory.events": V2_EVENTS.format(1)})
    probe = HostProbe(tmp_path)
    sample = probe.read()
    assert (sample.ram_limited, sample.ram_peak, sample.oom_kills) == (False, None, 1)
    assert probe.memory_counters() == (1, None)


@pytest.mark.parametrize(("which", "problem"), [
    ("no-gpu", "NVML sees no GPU on this machine"),
    ("hidden", "CUDA_VISIBLE_DEVICES hides all 8 GPUs from the server"),
    ("no-power-clocks", "NVML does not list the processes of GPU 0: GPU memory is not shown "
                        "per kernel"),
])
def test_the_host_probe_says_why_gpus_are_missing(board, container: Path, which: str,
                                                  problem: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    board("8xH100" if which == "hidden" else which)
    if which == "hidden":
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert HostProbe(container).read().gpu_problem == problem


# --- deaths ----------------------------------------------------------------------------

def host_sample(at: float, used: int, *, limit: int = 2 * GIB, peak: int | None = GIB,
                oom: int | None = 0, alive: int | None = None) -> HostSample:
    """A reading at time ``at``; ``alive``: the PID of kernel "k" seen alive in it."""
    watched = {} if alive is None else {"k": ProcessTree(alive, True, (alive,), 1, None)}
    return HostSample(time=at, cpu_percent=0.0, ram_used=used, ram_limit=limit,
                      ram_available=limit - used, swap_used=0, swap_total=0, process_rss=0,
                      ram_peak=peak, oom_kills=oom, watched=MappingProxyType(watched))


HISTORY = [host_sample(1.0, GIB, alive=7), host_sample(2.0, GIB + 5 * MIB, alive=7),
           host_sample(3.0, GIB + 9 * MIB), host_sample(4.0, GIB)]


def test_the_samples_before_a_death_start_at_the_last_that_saw_it_alive() -> None:
    assert before_death(HISTORY, "k", 7, now=4.5) == HISTORY[1:]
    assert before_death(HISTORY, "k", 8, now=4.5) == HISTORY  # never seen: the recent ones
    assert before_death(HISTORY, "k", None, now=13.5) == HISTORY[-1:]


@pytest.mark.parametrize(("returncode", "oom_now", "peak_now", "expected"), [
    # The cgroup counted an OOM kill since: out of memory, and its peak counter rose.
    (-9, 1, 2 * GIB - MIB, Death("out of memory", True, 2 * GIB, 2 * GIB - MIB)),
    # A plain SIGKILL far from the limit; the peak is the highest sampled.
    (-9, 0, GIB, Death("killed by signal 9", False, 2 * GIB, GIB + 9 * MIB)),
    (1, 0, GIB, Death("exited with code 1", False, 2 * GIB, GIB + 9 * MIB)),
    (-15, None, None, Death("killed by signal 15", False, 2 * GIB, GIB + 9 * MIB)),
    (None, 0, GIB, Death(None, False, 2 * GIB, GIB + 9 * MIB)),
    # A SIGKILL while the peak counter shows RAM within 5% of the limit: out of memory.
    (-9, 0, 2 * GIB - 100 * MIB, Death("out of memory", True, 2 * GIB, 2 * GIB - 100 * MIB)),
    # ... but not a SIGTERM, nor a SIGKILL 6% below the limit.
    (-15, 0, 2 * GIB - 100 * MIB, Death("killed by signal 15", False, 2 * GIB,
                                        2 * GIB - 100 * MIB)),
    (-9, 0, 2 * GIB - 123 * MIB, Death("killed by signal 9", False, 2 * GIB,
                                       2 * GIB - 123 * MIB)),
])
def test_explain_death(returncode: int | None, oom_now: int | None, peak_now: int | None,
                       expected: Death) -> None:
    assert explain_death(returncode, HISTORY[1:], oom_now, peak_now) == expected


def test_a_death_without_samples_has_no_figures() -> None:
    assert explain_death(-9, [], 3, 5 * GIB) == Death("killed by signal 9", False, None, None)
