"""The ``ipycloud`` command, run as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ipycloud import __version__


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipycloud", *args],
                          capture_output=True, text=True, timeout=120)


def test_info_prints_the_report() -> None:
    result = run("info")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Platform")
    assert "No NVIDIA GPU" in result.stdout
    assert f"{os.cpu_count()} logical" in result.stdout


def test_info_json_parses_and_matches_the_machine() -> None:
    result = run("info", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["host"]["cpu_logical"] == os.cpu_count()
    assert data["gpus"]["devices"] == []
    assert data["software"]["python"] == sys.version.split()[0]
    assert data["disks"][0]["path"] == os.getcwd()


def test_console_script_runs_demo() -> None:
    script = Path(sys.executable).with_name("ipycloud")
    result = subprocess.run([str(script), "demo"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"ipycloud {__version__}" in result.stdout
    assert "Platform" in result.stdout and "%load_ext ipycloud" in result.stdout
    assert "- starting on cpu (no GPU visible, no torch_xla, no MPS)" in result.stdout
    assert "was killed with SIGKILL (exit status -9)" in result.stdout
    assert "- the same command again: resuming from step-0000000" in result.stdout
    assert "equal the uninterrupted run's, bit for bit: True" in result.stdout
    readings = re.search(r"background sampler took (\d+) readings over .*: CPU (\d+)% on "
                         r"average, (\d+)% at peak; RAM at most", result.stdout)
    assert readings is not None, result.stdout
    assert int(readings[1]) >= 5 and int(readings[3]) > 0  # the training runs were seen
    assert not list(Path(tempfile.gettempdir()).glob("ipycloud-demo-*"))  # cleaned up


def test_demo_without_torch_says_how_to_get_the_rest() -> None:
    code = "import sys; sys.modules['torch'] = None; from ipycloud.cli import main; main(['demo'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torch is not installed: pip install 'ipycloud[torch]'" in result.stdout


def test_version() -> None:
    assert run("--version").stdout.strip() == f"ipycloud {__version__}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "the following arguments are required: COMMAND"),
        (("bogus",), "invalid choice: 'bogus'"),
        (("info", "--nope"), "unrecognized arguments: --nope"),
    ],
)
def test_bad_arguments_exit_2_with_one_error_line(args, message) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and message in error_lines[0]
