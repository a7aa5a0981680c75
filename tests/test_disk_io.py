"""The disks' I/O in the machine's readings: bytes per second read and written between two
readings, each byte counted once (whole disks, no loop or RAM devices), unknown across a
change of the devices or a reset of their counters, and served as ``disk_io``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ipycloud.runtime.monitor import disk_io, route_bodies
from ipycloud.runtime.monitor.disk_io import DiskIoMeter, block_device_counters, whole_disks
from ipycloud.runtime.monitor.host import HostProbe, HostSample
from ipycloud.runtime.monitor.samples import Sample

MIB = 2**20


def io(read: int, written: int) -> SimpleNamespace:
    """psutil's counters of one device (those read here), with these bytes read and written."""
    return SimpleNamespace(read_count=1, write_count=1, read_bytes=read, write_bytes=written)


def test_partitions_of_a_counted_disk_and_loop_and_ram_devices_are_left_out() -> None:
    names = ["sda", "sda1", "sda2", "nvme0n1", "nvme0n1p1", "nvme0n1p12", "mmcblk0p1",
             "xvdb1", "vdc", "md0", "loop0", "loop12", "ram0", "zram0", "dm-0"]
    # mmcblk0p1 and xvdb1 stay: their disks are not listed, so only they count their I/O.
    assert whole_disks(names) == {"sda", "nvme0n1", "mmcblk0p1", "xvdb1", "vdc", "md0",
                                  "dm-0"}
    assert whole_disks(["nvme0n1", "nvme0n10"]) == {"nvme0n1", "nvme0n10"}  # two disks


def test_counters_are_the_whole_disks_bytes_read_and_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[dict[str, object]] = []

    def counters(**options: object) -> dict[str, SimpleNamespace]:
        asked.append(options)
        return {"sda": io(3 * MIB, 5 * MIB), "sda1": io(MIB, MIB), "loop0": io(7, 7)}

    monkeypatch.setattr(disk_io.psutil, "disk_io_counters", counters)
    assert block_device_counters() == {"sda": (3 * MIB, 5 * MIB)}
    assert asked == [{"perdisk": True, "nowrap": False}]  # psutil must not hide a reset


def test_disk_io_rates_are_bytes_per_second_between_readings() -> None:
    counters = {"sda": (1000, 4000), "nvme0n1": (0, 0)}
    clock = [10.0]
    meter = DiskIoMeter(lambda: dict(counters), lambda: clock[0])
    assert meter.read() == (None, None)  # no baseline yet
    counters.update(sda=(3000, 4000), nvme0n1=(2000, 8000))
    clock[0] = 12.0
    assert meter.read() == (2000.0, 4000.0)  # both disks, over two seconds
    counters["sda"] = (10, 10)  # its counters restarted (a driver reloaded)
    clock[0] = 13.0
    assert meter.read() == (None, None)
    counters["sdb"] = (0, 0)  # a disk attached: no rate across it
    clock[0] = 14.0
    assert meter.read() == (None, None)
    del counters["nvme0n1"]  # a disk gone: none either
    clock[0] = 15.0
    assert meter.read() == (None, None)
    counters["sdb"] = (512, 0)
    clock[0] = 16.0
    assert meter.read() == (512.0, 0.0)


def test_disk_io_is_unknown_where_no_disk_can_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def only_loops(**options: object) -> dict[str, SimpleNamespace]:
        return {"loop0": io(0, 0), "zram0": io(0, 0)}

    def no_diskstats(**options: object) -> dict[str, SimpleNamespace]:
        raise NotImplementedError("/proc/diskstats nor /sys/block are available")

    clock = [0.0]
    meter = DiskIoMeter(clock=lambda: clock[0])
    for counters in (only_loops, no_diskstats):
        monkeypatch.setattr(disk_io.psutil, "disk_io_counters", counters)
        for _ in range(2):
            clock[0] += 1.0
            assert meter.read() == (None, None)  # never 0 B/s


def test_the_reading_serves_disk_io_beside_the_network() -> None:
    figures = dict(time=0.0, cpu_percent=0.0, ram_used=MIB, ram_limit=2 * MIB,
                   ram_available=MIB, swap_used=0, swap_total=0, process_rss=MIB)
    served = route_bodies.reading(HostSample(**figures, disk_read_per_s=1.5 * MIB,
                                         disk_written_per_s=0.0), 1.0)
    assert served["disk_io"] == {"read_per_s": 1.5 * MIB, "written_per_s": 0.0}
    plain = route_bodies.reading(Sample(**figures), 1.0)  # a kernel's own sampler reads none
    assert plain["disk_io"] == {"read_per_s": None, "written_per_s": None}


def test_the_servers_probe_reads_disk_io_between_its_readings(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    counters = {"sda": io(MIB, 0), "sda1": io(MIB, 0)}
    monkeypatch.setattr(disk_io.psutil, "disk_io_counters", lambda **options: dict(counters))
    clock = [100.0]
    probe = HostProbe(tmp_path, clock=lambda: clock[0], home=str(tmp_path))
    first = probe.read()
    assert (first.disk_read_per_s, first.disk_written_per_s) == (None, None)
    counters.update(sda=io(5 * MIB, 8 * MIB), sda1=io(5 * MIB, 8 * MIB))
    clock[0] = 104.0
    later = probe.read()
    assert (later.disk_read_per_s, later.disk_written_per_s) == (MIB, 2 * MIB)
