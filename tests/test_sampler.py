"""The background sampler on real threads, and take_sample on fake NVML boards and cgroup trees."""

from __future__ import annotations

import itertools
import logging
import math
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pynvml as real
import pytest
from cgroup_files import make_v1, make_v2, write
from waiting import wait_for

from ipycloud.runtime.monitor import probe as probe_module
from ipycloud.runtime.monitor import route_bodies
from ipycloud.runtime.monitor.probe import Probe, disks_of, take_sample
from ipycloud.runtime.monitor.readings import readings
from ipycloud.runtime.monitor.sampler import Sampler, shared_sampler
from ipycloud.runtime.monitor.samples import GpuSample, Sample

MIB = 2**20
GIB = 2**30


def waiting(sampler: Sampler) -> bool:
    """Whether the sampler's thread sits in its wait for the next tick."""
    thread = sampler._thread
    frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
    return frame is not None and (frame.f_code.co_filename, frame.f_code.co_name) == (
        threading.__file__, "wait")


class CountingProbe:
    """A fast probe whose samples carry their sequence number (1, 2, ...) as their time."""

    def __init__(self, failures: int = 0, gate: threading.Event | None = None) -> None:
        self.count = 0
        self.failures = failures  # the first calls that raise
        self.gate = gate  # when given, no reading before it is set

    def __call__(self) -> Sample:
        if self.gate is not None:
            self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise OSError("sensor gone\nsecond line")
        self.count += 1
        return Sample(time=float(self.count), cpu_percent=1.0, ram_used=GIB, ram_limit=4 * GIB,
                      ram_available=3 * GIB, swap_used=0, swap_total=0, process_rss=MIB)


class Collector:
    """A subscriber callback that keeps what it receives, and on which thread."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.threads: set[str] = set()

    def __call__(self, sample: Sample) -> None:
        self.samples.append(sample)
        self.threads.add(threading.current_thread().name)


def test_history_stays_bounded_and_keeps_the_newest() -> None:
    probe = CountingProbe()
    sampler = Sampler(interval=0.001, capacity=50, probe=probe)
    subscription = sampler.subscribe(Collector())
    wait_for(lambda: probe.count >= 500)
    subscription.cancel()
    wait_for(lambda: not sampler.running)
    history = sampler.history()
    assert [sample.time for sample in history] == [float(n) for n in
                                                   range(probe.count - 49, probe.count + 1)]
    assert sampler.latest() is history[-1]
    assert [s.time for s in sampler.history(since=probe.count - 3)] == [
        float(probe.count - 2), float(probe.count - 1), float(probe.count)]


def test_a_raising_subscriber_is_removed_and_reported_while_others_go_on(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(sample: Sample) -> None:
        raise ValueError("no plot\nwith details")

    gate = threading.Event()
    sampler = Sampler(interval=0.005, probe=CountingProbe(gate=gate))
    good = Collector()
    bad = sampler.subscribe(broken)
    sampler.subscribe(good)
    gate.set()  # both are subscribed before the first sample
    with caplog.at_level(logging.WARNING, logger="ipycloud.runtime.monitor.sampler"):
        wait_for(lambda: len(good.samples) >= 5)
    sampler.stop()
    assert not bad.active
    assert sampler.errors == [
        "sampler subscriber test_a_raising_subscriber_is_removed_and_reported_while_others_go_on"
        ".<locals>.broken raised ValueError: no plot with details; it no longer gets samples"]
    assert [record.getMessage() for record in caplog.records] == sampler.errors
    assert good.samples[0].time == 1.0  # the raising one ran first and did not stop delivery
    assert good.threads == {"ipycloud-sampler"}


def test_a_raising_probe_is_logged_once_and_sampling_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    sampler = Sampler(interval=0.005, probe=CountingProbe(failures=3))
    good = Collector()
    with caplog.at_level(logging.WARNING, logger="ipycloud.runtime.monitor.sampler"):
        sampler.subscribe(good)
        wait_for(lambda: len(good.samples) >= 2)
    sampler.stop()
    assert [record.getMessage() for record in caplog.records] == [
        "sampler probe failed: OSError: sensor gone second line"]
    assert sampler.errors == []
    assert len(sampler.history()) >= 2


def test_stop_is_prompt_with_a_one_hour_interval_and_subscribing_restarts() -> None:
    sampler = Sampler(interval=3600, probe=CountingProbe())
    first = sampler.subscribe(Collector())
    wait_for(lambda: len(sampler.history()) == 1 and waiting(sampler))
    sampler.stop(timeout=5)
    assert not sampler.running  # join() did not run out: the hour-long wait was woken
    assert not first.active
    again = Collector()
    second = sampler.subscribe(again)
    assert sampler.running
    wait_for(lambda: len(again.samples) == 1)
    assert [sample.time for sample in sampler.history()] == [1.0, 2.0]  # history kept
    second.cancel()
    wait_for(lambda: not sampler.running)


def test_interval_is_the_shortest_asked_for_and_changes_at_once() -> None:
    probe = CountingProbe()
    sampler = Sampler(interval=3600, probe=probe)
    assert sampler.interval == 3600
    slow = sampler.subscribe(Collector(), interval=60)
    default = sampler.subscribe(Collector())
    assert sampler.interval == 60
    wait_for(lambda: probe.count == 1 and waiting(sampler))  # for 60 s, unless woken
    fast = sampler.subscribe(Collector(), interval=0.002)
    assert sampler.interval == 0.002
    wait_for(lambda: probe.count >= 20)  # woken: no waiting out the old interval
    fast.cancel()
    assert sampler.interval == 60
    wait_for(lambda: waiting(sampler))
    settled = probe.count
    time.sleep(0.1)  # 50 ticks at the fast interval
    assert probe.count == settled
    slow.cancel()
    assert sampler.interval == 3600
    default.cancel()
    wait_for(lambda: not sampler.running)


def test_each_subscriber_gets_samples_at_its_own_interval() -> None:
    """A slow subscriber keeps its pace while a fast one drives the thread (times 1, 2, ...)."""
    sampler = Sampler(interval=3600, probe=CountingProbe())
    every, paced = Collector(), Collector()
    sampler.subscribe(every, interval=0.001)
    sampler.subscribe(paced, interval=5)
    wait_for(lambda: len(every.samples) >= 30)
    sampler.stop()
    times = [sample.time for sample in paced.samples]
    assert len(times) >= 5
    assert {later - earlier for earlier, later in itertools.pairwise(times)} == {5.0}


def test_cancel_is_idempotent_and_the_thread_ends_with_the_last_subscription() -> None:
    sampler = Sampler(interval=0.005, probe=CountingProbe())
    first, second = sampler.subscribe(Collector()), sampler.subscribe(Collector())
    first.cancel()
    first.cancel()
    assert not first.active and second.active
    assert sampler.running
    second.cancel()
    wait_for(lambda: not sampler.running)
    assert not second.active


def test_subscribers_counts_the_active_subscriptions() -> None:
    gate = threading.Event()
    sampler = Sampler(interval=0.005, probe=CountingProbe(gate=gate))
    assert sampler.subscribers == 0
    first, second = sampler.subscribe(Collector()), sampler.subscribe(Collector(), interval=1)
    broken = sampler.subscribe(lambda sample: 1 / 0)
    assert sampler.subscribers == 3
    first.cancel()
    first.cancel()
    assert sampler.subscribers == 2
    gate.set()
    wait_for(lambda: not broken.active)  # removed for raising
    assert sampler.subscribers == 1 and second.active
    sampler.stop()
    assert sampler.subscribers == 0
    with pytest.raises(AttributeError):
        sampler.subscribers = 1  # type: ignore[misc]


def test_a_subscriber_can_cancel_itself_from_the_sampler_thread() -> None:
    gate = threading.Event()
    sampler = Sampler(interval=0.005, probe=CountingProbe(gate=gate))
    received: list[Sample] = []

    def once(sample: Sample) -> None:
        received.append(sample)
        subscription.cancel()

    subscription = sampler.subscribe(once)
    gate.set()
    wait_for(lambda: not sampler.running)
    assert len(received) == 1
    assert sampler.errors == []


def test_subscribe_and_cancel_from_many_threads_while_sampling() -> None:
    probe = CountingProbe()
    sampler = Sampler(interval=0.5, probe=probe)
    keeper = sampler.subscribe(Collector())
    failures: list[BaseException] = []

    def churn() -> None:
        try:
            for n in range(20):
                got = Collector()
                subscription = sampler.subscribe(got, interval=0.001 + n / 1000)
                wait_for(lambda got=got: len(got.samples) > 0)  # woken from the 0.5 s wait
                subscription.cancel()
                subscription.cancel()
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and sampler.errors == []
    assert sampler.running and sampler.interval == 0.5
    keeper.cancel()
    wait_for(lambda: not sampler.running)


BAD_INTERVALS = [0, -1, math.nan, math.inf, -math.inf, 3601, "1", True]
INTERVAL_ERROR = "^interval must be a number of seconds above 0 and at most 3600, not "


@pytest.mark.parametrize("bad", [*BAD_INTERVALS, None])
def test_bad_default_intervals_are_refused_in_one_line(bad: Any) -> None:
    with pytest.raises(ValueError, match=INTERVAL_ERROR + f"{bad!r}$"):
        Sampler(interval=bad)


@pytest.mark.parametrize("bad", BAD_INTERVALS)
def test_bad_subscription_intervals_are_refused_in_one_line(bad: Any) -> None:
    sampler = Sampler(probe=CountingProbe())
    with pytest.raises(ValueError, match=INTERVAL_ERROR + f"{bad!r}$"):
        sampler.subscribe(Collector(), interval=bad)
    assert not sampler.running


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_bad_capacities_are_refused_in_one_line(bad: Any) -> None:
    with pytest.raises(ValueError, match=f"^capacity must be a whole number of samples, "
                                         f"at least 1, not {bad!r}$"):
        Sampler(capacity=bad)


def test_the_shared_sampler_is_one_per_process_and_reads_the_machine() -> None:
    assert shared_sampler() is shared_sampler()
    sample = shared_sampler().sample_now()
    assert sample.ram_limit > 0 and sample.process_rss > 0


def test_take_sample_reads_this_machine(tmp_path: Path) -> None:
    sample = take_sample()
    assert 0 <= sample.cpu_percent <= 100
    assert 0 < sample.ram_used < sample.ram_limit
    assert 0 < sample.ram_available <= sample.ram_limit
    assert sample.process_rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.5)
    assert sample.disks[0].roles[0] == "working" and sample.disks[0].paths[0] == os.getcwd()
    only_working = Probe(working=str(tmp_path), persistent=str(tmp_path / "not-mounted")).read()
    assert [(disk.roles, disk.paths) for disk in only_working.disks] == [
        (("working",), (str(tmp_path),))]
    assert only_working.disks[0].available > 0


def test_disks_are_what_df_shows_one_entry_per_file_system(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 GiB file system with 50 GiB free blocks, 5 GiB of them kept for root: df shows
    50 GiB used, 45 GiB available, Use% 53 (of the 95 GiB a user may fill)."""
    home, scratch = tmp_path / "my 'home' \"dir\"", tmp_path / "scratch, too"
    home.mkdir()
    scratch.mkdir()
    real_statvfs = os.statvfs
    frame = 4096  # f_frsize; f_bsize differs, as on many file systems

    def statvfs(path: str) -> os.statvfs_result:
        if path not in (str(home), str(scratch)):
            return real_statvfs(path)
        return os.statvfs_result((2**20, frame, 100 * GIB // frame, 50 * GIB // frame,
                                  45 * GIB // frame, 1000, 500, 500, 0, 255))

    monkeypatch.setattr(os, "statvfs", statvfs)
    disks = disks_of((("home", str(home)), ("persistent", "/proc"), ("scratch", str(scratch)),
                      ("working", str(home)), ("drive", str(tmp_path / "not mounted")),
                      ("unknown", None)))
    shared, proc = disks  # home and scratch share a device; /proc is a file system apart
    assert (shared.roles, shared.paths) == (("home", "scratch"), (str(home), str(scratch)))
    assert (shared.total, shared.used, shared.available) == (100 * GIB, 50 * GIB, 45 * GIB)
    assert proc.roles == ("persistent",)

    sample = Sample(time=0.0, cpu_percent=0.0, ram_used=GIB, ram_limit=2 * GIB,
                    ram_available=GIB, swap_used=0, swap_total=0, process_rss=MIB,
                    disks=(shared,))
    row = readings(sample)[-1]
    assert (row.key, row.label, row.detail) == ("disk:home, scratch", "disk home, scratch",
                                                f"{home}, {scratch}")
    assert row.gauges[0].text == "53% · 45.0 GiB free of 100.0 GiB"
    assert row.gauges[0].level == ""  # 53% of what can be filled
    assert route_bodies.reading(sample, 1.0)["disks"] == [{
        "name": "home, scratch", "roles": ["home", "scratch"], "paths": [str(home), str(scratch)],
        "used": 50 * GIB, "available": 45 * GIB, "total": 100 * GIB}]


def test_cpu_percent_sees_a_busy_thread() -> None:
    probe = Probe()
    probe.read()
    stop = time.monotonic() + 0.3
    while time.monotonic() < stop:
        pass
    cores = len(os.sched_getaffinity(0))
    assert probe.read().cpu_percent >= 100 / cores / 2  # one core of ours was busy


def test_a_sampler_runs_the_real_probe() -> None:
    sampler = Sampler(interval=0.05)
    got = Collector()
    subscription = sampler.subscribe(got)
    wait_for(lambda: len(got.samples) >= 2)
    subscription.cancel()
    first, second = got.samples[:2]
    assert second.time > first.time and second.ram_limit == first.ram_limit > 0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cgroup_v2_limits_are_honoured(tmp_path: Path) -> None:
    make_v2(tmp_path, {
        "kube.slice/memory.max": f"{GIB}\n",
        "kube.slice/cpu.max": "50000 100000\n",
        "kube.slice/pod/memory.max": "max\n",
        "kube.slice/pod/memory.current": f"{700 * MIB}\n",
        "kube.slice/pod/memory.stat": f"anon {400 * MIB}\nfile {300 * MIB}\n"
                                      f"active_file {100 * MIB}\ninactive_file {200 * MIB}\n",
        "kube.slice/pod/cpu.stat": "usage_usec 1000000\nuser_usec 800000\n",
    }, self_path="/kube.slice/pod")
    clock = Clock()
    probe = Probe(root=tmp_path, clock=clock)
    write(tmp_path, "sys/fs/cgroup/kube.slice/pod/cpu.stat", "usage_usec 1250000\n")
    clock.now += 1.0  # a quarter of a core for one second, under a half-core limit
    sample = probe.read()
    host = psutil.virtual_memory()
    assert sample.cpu_percent == pytest.approx(50.0)
    assert sample.ram_limit == min(GIB, host.total)
    assert sample.ram_limited == (host.total >= GIB)  # the dashboard says "container limit"
    assert sample.ram_used == 500 * MIB  # page cache that can be dropped does not count
    assert sample.ram_available == min(sample.ram_limit - 500 * MIB, host.available)
    write(tmp_path, "sys/fs/cgroup/kube.slice/pod/cpu.stat", "usage_usec 9000000\n")
    clock.now += 1.0
    assert probe.read().cpu_percent == 100.0  # capped


def test_cgroup_v1_limits_are_honoured(tmp_path: Path) -> None:
    make_v1(tmp_path, "5:memory:/docker/abc\n4:cpuacct:/docker/abc\n3:cpu:/docker/abc\n", {
        "memory/docker/abc/memory.limit_in_bytes": f"{2 * GIB}\n",
        "memory/docker/abc/memory.usage_in_bytes": f"{GIB}\n",
        "memory/docker/abc/memory.stat": f"cache {300 * MIB}\ntotal_inactive_file {256 * MIB}\n",
        "cpu/docker/abc/cpu.cfs_quota_us": "200000\n",
        "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpuacct/docker/abc/cpuacct.usage": "5000000000\n",
    })
    clock = Clock()
    probe = Probe(root=tmp_path, clock=clock)
    write(tmp_path, "sys/fs/cgroup/cpuacct/docker/abc/cpuacct.usage", "6000000000\n")
    clock.now += 2.0  # one core-second in two seconds, under a two-core limit
    sample = probe.read()
    assert sample.cpu_percent == pytest.approx(25.0 if len(os.sched_getaffinity(0)) >= 2
                                               else 50.0)
    assert sample.ram_limit == min(2 * GIB, psutil.virtual_memory().total)
    assert sample.ram_used == GIB - 256 * MIB


def test_a_reading_between_ticks_leaves_their_cpu_window_whole(tmp_path: Path) -> None:
    """A reading between two ticks (cells take one before and after each cell) gives the use
    since the last tick and does not shorten the next tick's window."""
    make_v2(tmp_path, {"cpu.max": "100000 100000\n", "cpu.stat": "usage_usec 0\n"})
    clock = Clock()
    probe = Probe(root=tmp_path, clock=clock)
    write(tmp_path, "sys/fs/cgroup/cpu.stat", "usage_usec 1000000\n")
    clock.now += 1.0  # a busy second...
    assert probe.read(advance_cpu=False).cpu_percent == pytest.approx(100.0)
    clock.now += 3.0  # ...then three idle ones
    assert probe.read(advance_cpu=False).cpu_percent == pytest.approx(25.0)
    assert probe.read().cpu_percent == pytest.approx(25.0)  # the tick: over all four seconds
    clock.now += 1.0
    assert probe.read(advance_cpu=False).cpu_percent == pytest.approx(0.0)  # since that tick


def test_sample_now_does_not_advance_the_default_probe(monkeypatch) -> None:
    advanced: list[bool] = []
    counting = CountingProbe()

    def take_sample(advance_cpu: bool = True) -> Sample:
        advanced.append(advance_cpu)
        return counting()

    monkeypatch.setattr(probe_module, "take_sample", take_sample)  # the sampler's default
    sampler = Sampler(interval=0.005)
    sampler.sample_now()
    subscription = sampler.subscribe(Collector())
    wait_for(lambda: len(sampler.history()) >= 2)
    subscription.cancel()
    wait_for(lambda: not sampler.running)
    assert advanced[0] is False and set(advanced[1:]) == {True}  # only the ticks advance


def test_without_a_cgroup_limit_the_host_memory_is_the_limit(tmp_path: Path) -> None:
    make_v2(tmp_path, {"memory.max": "max\n", "memory.current": f"{GIB}\n"})
    sample = Probe(root=tmp_path).read()
    assert sample.ram_limit == psutil.virtual_memory().total
    assert sample.ram_used == sample.ram_limit - sample.ram_available  # the host's, not 1 GiB
    assert not sample.ram_limited


def gpus(sample: Sample) -> list[tuple[Any, ...]]:
    return [(gpu.index, gpu.name, gpu.utilization, gpu.memory_used, gpu.memory_total,
             gpu.temperature, gpu.power_draw_w, gpu.power_limit_w) for gpu in sample.gpus]


def test_gpu_fields_from_a_t4(board) -> None:
    board("1xT4")
    assert gpus(take_sample()) == [
        (0, "Tesla T4", 0, 3 * MIB, 15360 * MIB, 43, pytest.approx(9.321), 70.0)]


def test_gpu_fields_follow_cuda_visible_devices(board, monkeypatch) -> None:
    board("2xA100-MIG")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpus(Probe().read()) == [  # utilisation is n/a while MIG is on
        (0, "NVIDIA A100-SXM4-40GB", None, 37 * MIB, 40960 * MIB, 31, pytest.approx(52.713),
         400.0)]
    board("8xH100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [row[:3] + row[5:6] for row in gpus(Probe().read())] == [
        (0, "NVIDIA H100 80GB HBM3", 36, 33), (1, "NVIDIA H100 80GB HBM3", 12, 31)]


def test_fields_a_board_does_not_give_are_none(board) -> None:
    board("no-power-clocks")
    assert gpus(Probe().read()) == [
        (0, "Quadro P1000", 7, 512 * MIB, 4096 * MIB, None, None, None)]


def test_without_nvml_there_are_no_gpus(board) -> None:
    board("no-driver")
    assert Probe().read().gpus == ()


def test_handles_are_looked_up_once_and_a_lost_gpu_gives_none(board) -> None:
    module = board("1xT4")
    lookups = []
    by_index = module.nvmlDeviceGetHandleByIndex
    module.nvmlDeviceGetHandleByIndex = lambda index: lookups.append(index) or by_index(index)
    probe = Probe()
    for _ in range(3):
        assert gpus(probe.read())[0][3] == 3 * MIB
    assert lookups == [0]

    def lost(*_args: object) -> None:
        raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)

    for name in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
                 "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage"):
        setattr(module, name, lost)
    # The power limit is a setting, read with the handle; the readings are gone.
    assert gpus(probe.read()) == [(0, "Tesla T4", None, None, None, None, None, 70.0)]


def fake_torch(initialized: bool, devices: int = 1, broken: bool = False) -> types.ModuleType:
    """A module standing in for torch whose CUDA allocator reports 1 GiB used, 2 GiB kept."""

    def stats(device: int) -> dict[str, Any]:
        if broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"allocated_bytes": {"all": {"current": GIB * (device + 1)}},
                "reserved_bytes": {"all": {"current": 2 * GIB * (device + 1)}}}

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_initialized=lambda: initialized, device_count=lambda: devices,
        memory_stats_as_nested_dict=stats)
    return torch


def torch_figures(sample: Sample) -> list[tuple[int | None, int | None]]:
    return [(gpu.torch_allocated, gpu.torch_reserved) for gpu in sample.gpus]


def test_torch_figures_only_once_torch_uses_cuda(board, monkeypatch) -> None:
    board("8xH100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    probe = Probe()
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert torch_figures(probe.read()) == [(None, None), (None, None)]
    monkeypatch.setitem(sys.modules, "torch", fake_torch(initialized=False))
    assert torch_figures(probe.read()) == [(None, None), (None, None)]
    monkeypatch.setitem(sys.modules, "torch", fake_torch(initialized=True, devices=1))
    assert torch_figures(probe.read()) == [(GIB, 2 * GIB), (None, None)]
    monkeypatch.setitem(sys.modules, "torch", fake_torch(initialized=True, broken=True))
    sample = probe.read()
    assert torch_figures(sample) == [(None, None), (None, None)]
    assert all(isinstance(gpu, GpuSample) and gpu.memory_total for gpu in sample.gpus)


def test_take_sample_never_imports_torch() -> None:
    code = ("import sys; from ipycloud.runtime.monitor.probe import take_sample; take_sample(); "
            "print('torch' in sys.modules, 'psutil' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["False", "True"]  # the check can see imported modules
