"""ipycloud's server extension in a real Jupyter server (pytest-jupyter), on fake NVML boards
and a fake cgroup tree: each route's content, authentication, base URLs and bad input."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psutil
import pytest
from jupyter_server.auth import Authorizer
from server_fixtures import *  # noqa: F403
from server_fixtures import INTERVAL, MIB, RAM_LIMIT, Api, cgroup_file
from traitlets import TraitError

from ipycloud.runtime.machine import nvml
from ipycloud.runtime.monitor import route_bodies
from ipycloud.runtime.monitor.host import HostSample
from ipycloud.runtime.monitor.processes import ProcessTree
from ipycloud.server.handlers import AUTH_RESOURCE
from ipycloud.server.monitor import ServerMonitor
from ipycloud.server.settings import IpycloudServer

# Loading the extension must not trip the server's check for handlers without
# authentication (a warning that reraise_server_extension_failures turns into a failure).
# (jupyter_server 2.13 on; the warning's class is named by its text, as 2.12 lacks it).
pytestmark = pytest.mark.filterwarnings("error:Extension endpoints without")

READING_KEYS = {"time", "interval_s", "platform", "gpu_problem", "gpus", "cpu", "ram", "disks",
                "network", "disk_io"}
GPU_KEYS = {"index", "name", "uuid", "utilization_percent", "memory_used", "memory_total",
            "temperature_c", "power_w", "power_limit_w", "mig"}


def json_body(response: Any) -> Any:
    return json.loads(response.body)


def test_reading_of_a_t4_in_a_one_core_container(api: Api, jp_home_dir: Path) -> None:
    reading = api.get("reading")
    assert set(reading) == READING_KEYS
    assert reading["interval_s"] == INTERVAL
    assert reading["gpu_problem"] is None
    (gpu,) = reading["gpus"]
    assert set(gpu) == GPU_KEYS
    assert gpu == {
        "index": 0, "name": "Tesla T4", "uuid": "GPU-6b3c9a0e-1d2f-4c55-8e7a-0f1e2d3c4b50",
        "utilization_percent": 0.0, "memory_used": 3 * MIB, "memory_total": 15360 * MIB,
        "temperature_c": 43.0, "power_w": 9.321, "power_limit_w": 70.0, "mig": []}
    assert reading["cpu"]["cores"] == 1.0  # the cgroup quota of the fake tree
    assert 0.0 <= reading["cpu"]["percent"] <= 100.0
    assert reading["ram"]["limit"] == RAM_LIMIT
    assert reading["ram"]["limited"] is True
    assert reading["ram"]["used"] == 256 * MIB  # memory.current less inactive page cache
    assert reading["ram"]["peak"] == 400 * MIB
    assert {"swap_used", "swap_total"} <= set(reading["ram"])
    folders = {role: path for disk in reading["disks"]
               for role, path in zip(disk["roles"], disk["paths"], strict=True)}
    assert folders["home"] == str(jp_home_dir)
    assert "persistent" not in folders  # a local machine's persistent folder is the home
    for disk in reading["disks"]:
        assert disk["name"] == ", ".join(disk["roles"])
        assert disk["used"] > 0 and 0 < disk["available"] <= disk["total"] - disk["used"]
    assert reading["platform"] == {"name": "Local machine", "session_left_s": None}
    # the server runs in this process, and has no kernel
    assert reading["ram"]["server_rss"] == pytest.approx(
        psutil.Process().memory_info().rss, rel=0.5)
    assert reading["ram"]["kernels_rss"] == 0


def test_the_kernels_memory_is_the_sum_of_their_live_trees() -> None:
    trees = {"train": ProcessTree(11, True, (11, 12), 700 * MIB, 5.0),
             "eval": ProcessTree(21, True, (21,), 300 * MIB, None),
             "new": ProcessTree(31, True, (31,), None, None),  # not measured yet
             "ended": ProcessTree(41, False, (), None, None)}
    sample = HostSample(time=0.0, cpu_percent=0.0, ram_used=2048 * MIB,
                        ram_limit=4096 * MIB, ram_available=2048 * MIB, swap_used=0,
                        swap_total=0, process_rss=150 * MIB, watched=MappingProxyType(trees))
    ram = route_bodies.reading(sample, 1.0)["ram"]
    assert (ram["server_rss"], ram["kernels_rss"]) == (150 * MIB, 1000 * MIB)


@pytest.mark.parametrize("board_name", ["2xA100-MIG"])
def test_reading_of_two_a100_with_mig_instances(api: Api) -> None:
    gpus = api.get("reading")["gpus"]
    assert [gpu["index"] for gpu in gpus] == [0, 1]
    assert [gpu["utilization_percent"] for gpu in gpus] == [None, None]  # N/A under MIG
    assert [len(gpu["mig"]) for gpu in gpus] == [3, 2]
    assert gpus[1]["mig"][1] == {"uuid": "MIG-1a1c0b1d2-e3f4-5a6b-7c8d-9e0f1a2b3c4d",
                                 "memory_used": 0, "memory_total": 9856 * MIB}


@pytest.mark.parametrize("board_name", ["8xH100"])
def test_reading_of_eight_h100_follows_the_servers_cuda_visible_devices(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = api.get("reading")["gpus"]
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert [gpu["memory_used"] for gpu in gpus] == [1024 * i * MIB for i in range(8)]
    assert {gpu["name"] for gpu in gpus} == {"NVIDIA H100 80GB HBM3"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,2")
    nvml.shutdown()  # the next reading initialises NVML again and looks the GPUs up anew
    visible = api.wait(lambda: len(gpus := api.get("reading")["gpus"]) == 2 and gpus,
                       what="the two visible GPUs")
    assert [(gpu["index"], gpu["memory_used"]) for gpu in visible] == [
        (0, 5 * 1024 * MIB), (1, 2 * 1024 * MIB)]
    assert visible[0]["uuid"].endswith("5")


@pytest.mark.parametrize(("board_name", "problem"), [
    ("no-driver", "NVML Shared Library Not Found"),
    ("driver-not-loaded", "Driver Not Loaded"),
    ("no-gpu", "NVML sees no GPU on this machine"),
])
def test_without_a_usable_gpu_every_route_answers_with_the_reason(api: Api,
                                                                  problem: str) -> None:
    reading = api.get("reading")
    assert reading["gpus"] == []
    assert problem in reading["gpu_problem"]
    assert reading["ram"]["limit"] == RAM_LIMIT  # the rest of the reading stands
    assert problem in api.get("kernels")["gpu_problem"]
    assert api.get("history")["samples"]


def test_history_keeps_the_samples_and_filters_by_time(api: Api) -> None:
    samples = api.wait(lambda: (found := api.get("history")["samples"]) and len(found) >= 3
                       and found, what="three samples")
    times = [sample["time"] for sample in samples]
    assert times == sorted(times)
    assert api.get("history")["interval_s"] == INTERVAL
    later = api.get("history", params={"since": repr(times[1])})["samples"]
    assert [sample["time"] for sample in later][:len(times) - 2] == times[2:]
    assert api.get("history", params={"since": "1e12"})["samples"] == []


def test_cpu_throttling_is_the_share_of_periods_throttled_between_samples(
        api: Api, system_root: Path) -> None:
    api.get("reading")
    cgroup_file(system_root, "cpu.stat").write_text(
        "usage_usec 1200000\nnr_periods 1100\nnr_throttled 35\nthrottled_usec 9\n")
    api.wait(lambda: any(sample["cpu"]["throttled_percent"] == 25.0
                         for sample in api.get("history")["samples"]),
             what="a sample with 25 of 100 periods throttled")


def test_kernels_and_events_are_empty_without_kernels(api: Api) -> None:
    assert api.get("kernels") == {"gpu_problem": None, "kernels": []}
    assert api.get("events") == {"events": []}


@pytest.mark.parametrize("since", ["yesterday", "nan", "inf", "-inf", ""])
@pytest.mark.parametrize("route", ["history", "events"])
def test_a_malformed_since_is_a_400_with_a_message(api: Api, route: str, since: str) -> None:
    response = api.response("ipycloud", "api", route, params={"since": since})
    assert response.code == 400
    assert response.headers["Content-Type"] == "application/json"
    assert json_body(response) == {
        "message": f"since must be a finite number (a Unix time in seconds), not {since!r}"}


def test_an_unknown_kernel_is_a_404_with_a_message(api: Api) -> None:
    response = api.response("ipycloud", "api", "kernels", "no-such-kernel")
    assert response.code == 404
    assert json_body(response) == {"message": "no running kernel has the id 'no-such-kernel'"}


@pytest.mark.parametrize("route", ["reading", "history", "kernels", "kernels/x", "events"])
@pytest.mark.parametrize("authorization", ["", "token wrong"])
def test_every_route_refuses_a_request_without_the_token(api: Api, route: str,
                                                         authorization: str) -> None:
    response = api.response("ipycloud", "api", *route.split("/"),
                            headers={"Authorization": authorization})
    assert response.code == 403


class DenyIpycloud(Authorizer):
    """An authorizer that refuses the ipycloud resource and allows everything else."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != AUTH_RESOURCE


@pytest.mark.parametrize("server_extra_config",
                         [{"ServerApp": {"authorizer_class": DenyIpycloud}}])
def test_the_servers_authorizer_decides_on_the_ipycloud_resource(api: Api) -> None:
    assert api.response("ipycloud", "api", "reading").code == 403
    assert api.response("api", "status").code == 200  # the same user, another resource


@pytest.mark.parametrize("jp_base_url", ["/", "/user/ada/"])
def test_routes_follow_the_base_url(api: Api, jp_base_url: str) -> None:
    assert api.get("reading")["ram"]["limit"] == RAM_LIMIT
    assert api.get("events") == {"events": []}


def test_a_reading_is_taken_when_the_sampler_has_none_yet(system_root: Path,
                                                          board: Any) -> None:
    board("1xT4")
    monitor = ServerMonitor(IpycloudServer(interval=1.0, system_root=str(system_root)),
                            session_start=0.0)
    assert monitor.latest() is None  # never started: no sampler thread
    sample = asyncio.run(monitor.current())
    assert sample.ram_limit == RAM_LIMIT and [gpu.name for gpu in sample.gpus] == ["Tesla T4"]
    assert monitor.history() == []


def test_settings_refuse_absurd_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    for interval in (0.0, 0.01, math.inf, math.nan, 7200.0):
        with pytest.raises(TraitError, match=r"interval must be from 0\.1 to 3600 seconds"):
            IpycloudServer(interval=interval)
    with pytest.raises(TraitError, match="history must be above 0"):
        IpycloudServer(history=-1.0)
    monkeypatch.setenv("IPYCLOUD_SERVER_INTERVAL", "2.5")
    assert IpycloudServer().interval == 2.5
    monkeypatch.setenv("IPYCLOUD_SERVER_INTERVAL", "fast")
    with pytest.raises(TraitError, match="IPYCLOUD_SERVER_INTERVAL must be a number"):
        _ = IpycloudServer().interval
