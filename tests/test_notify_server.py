"""The Jupyter server extension alerts when a kernel dies out of memory: a real server, a
real kernel SIGKILLed while the fake cgroup counts an OOM kill (as in test_server_kernels),
and a loopback receiver for the alert."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from alert_receiver import AlertReceiver
from server_fixtures import *  # noqa: F403
from server_fixtures import MIB, Api, cgroup_file
from test_server_kernels import TIMEOUT, measured, start_session


def test_a_kernel_killed_out_of_memory_is_an_alert_and_other_deaths_are_not(
        api: Api, system_root: Path, monkeypatch: pytest.MonkeyPatch,
        alert_receiver: AlertReceiver) -> None:
    monkeypatch.setenv("IPYCLOUD_NOTIFY", alert_receiver.url())
    kernel_id = start_session(api, "train.ipynb")

    first = measured(api, kernel_id)["pid"]
    os.kill(first, signal.SIGKILL)  # RAM far from its limit, no OOM kill counted
    api.wait(lambda: api.get("events")["events"], timeout=TIMEOUT, what="the first death")

    second = measured(api, kernel_id, other_than=first)["pid"]
    cgroup_file(system_root, "memory.peak").write_text(f"{900 * MIB}\n")
    cgroup_file(system_root, "memory.events").write_text(
        "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    os.kill(second, signal.SIGKILL)
    api.wait(lambda: len(api.get("events")["events"]) == 2, timeout=TIMEOUT,
             what="the second death")

    (message,) = api.wait(lambda: alert_receiver.messages, timeout=TIMEOUT, what="the alert")
    assert (message["title"], message["message"], message["type"]) == (
        "ipycloud: a kernel ran out of memory",
        "the kernel of train.ipynb was killed: out of memory (limit 1024 MiB, peak 900 MiB)",
        "failure")
