"""Usage recorded from ``%load_ext ipycloud`` on, in a real IPython shell; turning it off."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
from waiting import wait_for

from ipycloud.runtime.monitor.sampler import shared_sampler
from ipycloud.runtime.monitor.usage import shared_tracker, usage_report


def sampler_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name == "ipycloud-sampler"]


@pytest.fixture
def make_shell() -> Iterator[Callable[[bool | None], InteractiveShell]]:
    """``make_shell(record)``: a fresh shell with ``UsageRecording.enabled = record`` in its
    config (None: not set) and ipycloud loaded; cleared after the test."""

    def make(record: bool | None) -> InteractiveShell:
        InteractiveShell.clear_instance()
        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        if record is not None:
            config.UsageRecording.enabled = record
        shell = InteractiveShell.instance(config=config)
        shell.run_line_magic("load_ext", "ipycloud")
        return shell

    yield make
    InteractiveShell.clear_instance()


def test_loading_the_extension_starts_recording_usage(make_shell) -> None:
    assert sampler_threads() == []
    shell = make_shell(None)  # the default

    sampler = shared_sampler()
    assert sampler.running and sampler.subscribers == 1 and sampler.interval == 1.0
    wait_for(lambda: shared_tracker().samples >= 1, what="the first recorded sample")
    report = usage_report()
    assert report.samples >= 1 and report.ram_limit > 0
    assert "GPU-hours" in str(shell.run_line_magic("dashboard", "report"))


def test_with_recording_off_no_sampler_runs(make_shell) -> None:
    make_shell(False)

    assert sampler_threads() == [] and shared_sampler().subscribers == 0
    with pytest.raises(ValueError, match=r"^no samples recorded yet"):
        usage_report()


def test_config_turns_recording_off_and_on_in_a_running_session(
        make_shell, capsys: pytest.CaptureFixture[str]) -> None:
    shell = make_shell(None)
    assert sampler_threads() == ["ipycloud-sampler"]

    shell.run_line_magic("config", "UsageRecording.enabled = False")
    wait_for(lambda: not sampler_threads(), what="the sampler to stop")
    assert shared_sampler().subscribers == 0
    shell.run_line_magic("config", "UsageRecording.enabled = True")
    assert shared_sampler().subscribers == 1 and sampler_threads() == ["ipycloud-sampler"]
    shell.run_line_magic("config", "UsageRecording")
    shown = capsys.readouterr().out
    assert "UsageRecording.enabled=<Bool>\n    Record CPU, RAM and GPU use" in shown


def test_reloading_the_extension_keeps_one_subscription(make_shell) -> None:
    shell = make_shell(None)
    shell.run_line_magic("reload_ext", "ipycloud")
    assert shared_sampler().subscribers == 1 and sampler_threads() == ["ipycloud-sampler"]


def test_starting_the_sampler_leaves_its_probe_to_the_sampler_thread() -> None:
    """What %load_ext imports to start recording: no psutil, NVML or price table; the
    sampler's thread imports its probe on its first tick."""
    code = (
        "import sys\n"
        "import ipycloud.runtime.monitor.session\n"
        "print(sorted({'psutil', 'pynvml', 'ipycloud.runtime.monitor.probe',\n"
        "              'ipycloud.runtime.monitor.prices',\n"
        "              'ipycloud.runtime.monitor.usage_report',\n"
        "              'ipycloud.runtime.machine.platform'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
