"""Without an optional package, every entry point says in one line which pip extra to install.

Each case runs in a fresh process where the package cannot be imported, as if it were not
installed: a terminal IPython for the magics, plain Python for the API.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from terminal import terminal_ipython

NO_TORCH = "torch is required for this feature: pip install 'ipycloud[torch]'"
NO_WIDGETS = "ipywidgets is required for this feature: pip install 'ipycloud[widgets]'"

# Each entry point of the Python API, called as a user without the package would.
CALLS = {
    "fit": "ipycloud.fit(object(), object(), [[0.0, 1.0]], epochs=1, progress=False)",
    "launch": "ipycloud.launch(print, nprocs=1)",
    "CheckpointManager": "ipycloud.CheckpointManager(folder)",
    "live_dashboard": "ipycloud.live_dashboard().stop()",
}
SCRIPT = """
import json, sys
for name in {hidden!r}:
    sys.modules[name] = None
import ipycloud
folder = sys.argv[1]
outcomes = {{}}
for name, call in {calls!r}.items():
    try:
        eval(call)
        outcomes[name] = None
    except Exception as error:
        outcomes[name] = [isinstance(error, ImportError), str(error)]
print(json.dumps(outcomes))
"""


def api_outcomes(hidden: tuple[str, ...], folder: Path) -> dict[str, list[object] | None]:
    """For each call: None when it worked, else [whether an ImportError, its message]."""
    script = SCRIPT.format(hidden=hidden, calls=CALLS)
    result = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def without_torch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[object] | None]:
    return api_outcomes(("torch",), tmp_path_factory.mktemp("no-torch") / "checkpoints")


@pytest.mark.parametrize("entry", ["fit", "launch", "CheckpointManager"])
def test_the_api_without_torch_raises_one_import_error_line(without_torch, entry) -> None:
    assert without_torch[entry] == [True, NO_TORCH]


def test_the_live_dashboard_needs_no_torch(without_torch) -> None:
    assert without_torch["live_dashboard"] is None


def test_the_live_dashboard_without_ipywidgets_names_its_extra(tmp_path: Path) -> None:
    outcomes = api_outcomes(("ipywidgets",), tmp_path)
    assert outcomes["live_dashboard"] == [True, NO_WIDGETS]


def test_checkpoint_magic_without_torch_is_one_line_without_traceback(tmp_path: Path) -> None:
    folder = tmp_path / "my checkpoints"
    result = terminal_ipython([
        "%load_ext ipycloud",
        "step = 3",
        f"%checkpoint save step --dir '{folder}'",
        f"%checkpoint restore step --dir '{folder}'",
        "%checkpoint auto step --every 5m",
        "%checkpoint auto --off",
    ], hidden=("torch",))
    assert result.stderr.splitlines() == [
        f"UsageError: %checkpoint {action}: {NO_TORCH}" for action in ("save", "restore",
                                                                       "auto")]
    assert "Traceback" not in result.stdout
    assert "no automatic checkpoint was registered" in result.stdout
    assert not folder.exists()


def test_load_ext_and_gpuinfo_work_without_torch() -> None:
    result = terminal_ipython(["%load_ext ipycloud", "report = %gpuinfo",
                               "print(str(report).splitlines()[0].split()[0])"],
                              hidden=("torch",))
    assert result.stderr == "" and "Platform" in result.stdout
