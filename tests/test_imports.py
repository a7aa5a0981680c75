"""``import ipycloud`` and ``%load_ext ipycloud`` stay light: no heavy package is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = {"torch", "torch_xla", "ipywidgets", "pynvml", "kagglehub", "gdown"}


def imported_modules(code: str) -> set[str]:
    """Top-level modules a fresh interpreter imports to run ``code``, from -X importtime."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                            capture_output=True, text=True, check=True)
    names = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert "ipycloud" in names  # the measurement itself saw the package being imported
    return names


def test_import_ipycloud_imports_no_heavy_package() -> None:
    assert imported_modules("import ipycloud") & HEAVY == set()


def test_load_ext_imports_no_heavy_package() -> None:
    """Usage recording is off here: its sampler thread imports NVML a moment after loading,
    racing this check (test_usage_recording checks what starting it imports)."""
    code = ("from IPython.core.interactiveshell import InteractiveShell\n"
            "from traitlets.config import Config\n"
            "config = Config()\n"
            "config.UsageRecording.enabled = False\n"
            "InteractiveShell.instance(config=config).run_line_magic('load_ext', 'ipycloud')")
    assert imported_modules(code) & HEAVY == set()


def test_following_a_run_imports_no_heavy_package() -> None:
    """A notebook that only follows a run trained elsewhere needs no torch."""
    assert imported_modules("import ipycloud; ipycloud.follow") & HEAVY == set()


def test_the_measurement_does_see_heavy_imports() -> None:
    """The check above can fail: a probe that queries NVML is seen importing pynvml."""
    code = "import ipycloud.runtime.machine.nvml as n; n.snapshot()"
    assert "pynvml" in imported_modules(code)


def test_public_names_load_on_first_use() -> None:
    import ipycloud

    assert callable(ipycloud.environment_report)
    for name in ("fit", "loader", "launch", "CheckpointManager", "mount", "download",
                 "extract", "sync", "follow"):
        assert getattr(ipycloud, name).__name__ == name
    assert ipycloud.detect_platform().key
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = ipycloud.nope


SERVER = {"jupyter_server", "tornado", "jupyter_client"}


def test_import_ipycloud_imports_no_jupyter_server() -> None:
    """jupyter_server is no dependency of the package: only the server loads it."""
    assert imported_modules("import ipycloud") & SERVER == set()


def test_the_server_extension_hooks_import_no_jupyter_server() -> None:
    """``jupyter server extension list`` imports the hooks' module to check it: that, and
    asking for the extension points, import nothing of the server."""
    code = "import ipycloud.server as s; s._jupyter_server_extension_points()"
    assert imported_modules(code) & SERVER == set()


def test_the_server_measurement_sees_jupyter_server() -> None:
    """The checks above can fail: loading the routes imports jupyter_server."""
    assert "jupyter_server" in imported_modules("import ipycloud.server.routes")
