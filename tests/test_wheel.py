"""The wheel as a user gets it: built from this checkout, installed with pip into a fresh
virtual environment that has no node on its PATH, it brings the prebuilt lab extension and
the enabled server extension.

Slow (a wheel build and a JupyterLab install): select it with ``-m wheel``, or leave it
out with ``-m "not wheel"``.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

import ipycloud

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).parent.parent
LABEXTENSION = "ipycloud"  # the npm package's name: labextension/package.json


def run(command: list[str], **kwargs: Any) -> str:
    """Run a command; fail with its whole output when it fails. Returns stdout and stderr
    together, without the colours Jupyter's listings put in."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False, **kwargs)
    assert done.returncode == 0, f"{command} exited with {done.returncode}:\n{done.stdout}"
    return re.sub(r"\x1b\[[0-9;]*m", "", str(done.stdout))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build --wheel`` of this checkout (an isolated build, as pip makes it)."""
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        timeout=900)
    (built,) = dist.glob("ipycloud-*.whl")
    return built


def test_the_wheel_carries_the_built_extension_and_the_server_config(wheel: Path) -> None:
    data = f"ipycloud-{ipycloud.__version__}.data/data"
    share = f"{data}/share/jupyter/labextensions/{LABEXTENSION}"
    names = set(zipfile.ZipFile(wheel).namelist())
    # The JSON Schemas of the server's route bodies ship in the package.
    route_schemas = [f"ipycloud/server/schema/{path.name}"
                     for path in (ROOT / "ipycloud" / "server" / "schema").glob("*.json")]
    assert route_schemas
    for name in (f"{share}/package.json", f"{share}/install.json",
                 f"{share}/schemas/{LABEXTENSION}/plugin.json",
                 f"{data}/etc/jupyter/jupyter_server_config.d/ipycloud.json", *route_schemas):
        assert name in names, f"{wheel.name} lacks {name}"
    assert any(re.fullmatch(rf"{share}/static/remoteEntry\.[0-9a-f]+\.js", name)
               for name in names), f"{wheel.name} has no built remoteEntry"
    # Node's build inputs stay out of it (webpack names its vendor chunks after their
    # node_modules path: a file name, not the folder).
    assert not [name for name in names if "node_modules/" in name or name.endswith(".ts")]


def test_pip_installs_it_without_node_and_jupyter_lists_both_extensions_enabled(
        wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    # Only the new environment's scripts: no node, no jlpm, no other Python's jupyter.
    env = {**{name: value for name, value in os.environ.items()
              if not name.startswith(("JUPYTER", "VIRTUAL_ENV", "PYTHON"))},
           "PATH": str(bin_dir), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    assert shutil.which("node", path=env["PATH"]) is None
    assert shutil.which("nodejs", path=env["PATH"]) is None
    # The JupyterLab this environment runs: pip finds it in its cache or the local index.
    jupyterlab = f"jupyterlab=={importlib.metadata.version('jupyterlab')}"
    run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
         str(wheel), jupyterlab],
        env=env, cwd=tmp_path, timeout=900)

    labextensions = run([str(bin_dir / "jupyter"), "labextension", "list"], env=env,
                        cwd=tmp_path, timeout=120)
    assert re.search(rf"^\s*{re.escape(LABEXTENSION)} v{re.escape(ipycloud.__version__)}"
                     r" enabled\s+OK\b.*\(python, ipycloud\)", labextensions, re.M), labextensions

    server_extensions = run([str(bin_dir / "jupyter"), "server", "extension", "list"],
                            env=env, cwd=tmp_path, timeout=120)
    assert re.search(r"^\s*ipycloud\.server enabled\s*$", server_extensions, re.M), \
        server_extensions
    assert re.search(r"^\s*ipycloud\.server +(\S+ )?OK\s*$", server_extensions, re.M), \
        server_extensions
