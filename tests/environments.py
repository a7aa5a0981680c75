"""Fresh virtual environments for tests: the variables that keep a command inside one, the
commands run there, and what its Jupyter lists."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ipycloud

LABEXTENSION = "ipycloud"  # the npm package's name: labextension/package.json


def run(command: Sequence[str | Path], **kwargs: Any) -> str:
    """Run a command; fail with its whole output when it fails. Returns stdout and stderr
    together, without the colours Jupyter's listings put in."""
    done = subprocess.run([str(part) for part in command], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False, **kwargs)
    assert done.returncode == 0, f"{command} exited with {done.returncode}:\n{done.stdout}"
    return re.sub(r"\x1b\[[0-9;]*m", "", str(done.stdout))


def isolated_env(bin_dir: Path, jupyter_dirs: Path, *path: str) -> dict[str, str]:
    """The environment of a command run in the virtual environment of ``bin_dir``: its
    scripts first on PATH, then only ``path``; Jupyter's config, data and runtime folders
    under ``jupyter_dirs``, so no other Jupyter's extensions or kernels are seen."""
    return {**{name: value for name, value in os.environ.items()
               if not name.startswith(("JUPYTER", "VIRTUAL_ENV", "PYTHON"))},
            "PATH": os.pathsep.join([str(bin_dir), *path]),
            "JUPYTER_CONFIG_DIR": str(jupyter_dirs / "config"),
            "JUPYTER_DATA_DIR": str(jupyter_dirs / "data"),
            "JUPYTER_RUNTIME_DIR": str(jupyter_dirs / "runtime")}


def assert_extensions_enabled(bin_dir: Path, env: dict[str, str], cwd: Path) -> None:
    """``jupyter labextension list`` and ``jupyter server extension list`` of that
    environment show ipycloud's lab and server extensions enabled and OK."""
    labextensions = run([bin_dir / "jupyter", "labextension", "list"], env=env, cwd=cwd,
                        timeout=120)
    assert re.search(rf"^\s*{re.escape(LABEXTENSION)} v{re.escape(ipycloud.__version__)}"
                     r" enabled\s+OK\b.*\(python, ipycloud\)", labextensions, re.M), labextensions
    server_extensions = run([bin_dir / "jupyter", "server", "extension", "list"], env=env,
                            cwd=cwd, timeout=120)
    assert re.search(r"^\s*ipycloud\.server enabled\s*$", server_extensions, re.M), \
        server_extensions
    assert re.search(r"^\s*ipycloud\.server +(\S+ )?OK\s*$", server_extensions, re.M), \
        server_extensions
