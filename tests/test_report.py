"""The report's wording for the platform, memory and disks, and its unit formatting."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from ipycloud.runtime.machine.cgroup import CgroupLimits
from ipycloud.runtime.machine.platform import detect_platform
from ipycloud.runtime.machine.report import EnvironmentReport
from ipycloud.runtime.machine.snapshot import DiskInfo, probe_host, take_snapshot
from ipycloud.runtime.units import format_bytes, format_duration, parse_duration

GIB = 1024**3


@pytest.mark.parametrize(("value", "text"), [
    (None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (15 * GIB, "15.0 GiB"),
    (3 * 1024 * GIB, "3.0 TiB"),
])
def test_format_bytes(value, text) -> None:
    assert format_bytes(value) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "none known"), (600, "10 min"), (12 * 3600, "12 h"), (5400, "1 h 30 min"),
    (0, "0 s"), (45, "45 s"),
])
def test_format_duration(seconds, text) -> None:
    assert format_duration(seconds) == text


def test_colab_summary_names_its_signal_limits_and_missing_drive(tmp_path: Path) -> None:
    colab = detect_platform({"COLAB_RELEASE_TAG": "release-colab_20261101", "HOME": "/root"},
                            tmp_path)
    snapshot = dataclasses.replace(
        take_snapshot(), platform=colab,
        disks=(DiskInfo("persistent", "/content/drive/MyDrive", None, None),),
        host=probe_host(CgroupLimits(2, 12 * GIB, 4 * GIB, 2.0)),
    )
    summary = dict(EnvironmentReport(snapshot).summary())
    assert summary["Platform"].startswith("Google Colab (")
    assert "detected from env COLAB_RELEASE_TAG" in summary["Platform"]
    assert summary["Session limit"] == "12 h; idle timeout 1 h 30 min"
    assert summary["Persistent folder"] == "/content/drive/MyDrive"
    assert summary["Disk (persistent)"] == "/content/drive/MyDrive: not present"
    assert "free of 12.0 GiB" in summary["RAM"] and "container limit 12.0 GiB" in summary["RAM"]
    assert summary["CPU"].endswith(", 2 usable")


def test_a_small_container_and_disk_read_in_mib(tmp_path: Path) -> None:
    snapshot = dataclasses.replace(
        take_snapshot(), disks=(DiskInfo("scratch", "/tmp", 2 * GIB, 512 * 2**20),),
        host=probe_host(CgroupLimits(2, GIB, 256 * 2**20, 1.0)))
    summary = dict(EnvironmentReport(snapshot).summary())
    assert re.fullmatch(r"\d+ MiB free of 1024 MiB \(host .*, container limit 1.0 GiB\)",
                        summary["RAM"])
    assert summary["Disk (scratch)"] == "/tmp: 512 MiB free of 2048 MiB"


def test_binder_has_no_persistent_folder(tmp_path: Path) -> None:
    binder = detect_platform({"BINDER_SERVICE_HOST": "10.0.0.1", "HOME": "/home/jovyan"},
                             tmp_path)
    report = EnvironmentReport(dataclasses.replace(take_snapshot(), platform=binder))
    assert dict(report.summary())["Persistent folder"] == "none"
    assert "Binder" in report._repr_html_()


def test_html_escapes_what_it_shows(tmp_path: Path) -> None:
    odd = DiskInfo("working", "/tmp/<b>x</b>", None, None)
    report = EnvironmentReport(dataclasses.replace(take_snapshot(), disks=(odd,)))
    html = report._repr_html_()
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("2d", 172800), (" 1.5H ", 5400),
    ("30d", 2592000), ("720h", 2592000),
])
def test_parse_duration(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10x", "m", "-5m", "0", "0s", "10 m", "1h-2m"])
def test_parse_duration_refuses(text) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["30d1s", "721h", "99999999999h", "2592001"])
def test_a_duration_past_30_days_is_refused(text) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(text)
    assert str(caught.value) == f"{text!r} is longer than 30 days: give at most 30d"
