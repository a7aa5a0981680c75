"""A real Jupyter server (``jupyter server``, ``jupyter lab`` or ``jupyter notebook``) in a
subprocess with its own config, runtime and settings folders, spoken to over REST."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from waiting import wait_for


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def refused(port: int) -> bool:
    """Whether nothing listens on the loopback port any more."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


class JupyterProcess:
    """``python -m jupyter <app>`` serving ``root`` on a free loopback port with a token.

    Its folders live under ``home`` (config, runtime, lab settings and workspaces,
    IPython), so no test sees another's state. ``launcher``, a Python file, runs in place
    of ``-m``: it prepares the process (e.g. installs a fake library) and starts the app.
    """

    def __init__(self, home: Path, root: Path, app: str = "server",
                 arguments: Sequence[str] = (), env: dict[str, str] | None = None,
                 launcher: Path | None = None) -> None:
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = home / f"jupyter-{app}.log"
        self._log_file = self.log.open("wb")
        folders = {"JUPYTER_CONFIG_DIR": "config", "JUPYTER_RUNTIME_DIR": "runtime",
                   "JUPYTERLAB_SETTINGS_DIR": "settings",
                   "JUPYTERLAB_WORKSPACES_DIR": "workspaces", "IPYTHONDIR": "ipython"}
        self.env = {**os.environ, **{name: str(home / folder)
                                     for name, folder in folders.items()}, **(env or {})}
        start = [sys.executable, str(launcher)] if launcher else [sys.executable, "-m"]
        self.process = subprocess.Popen(
            [*start, "jupyter", app, f"--port={self.port}", "--ServerApp.port_retries=0",
             "--ServerApp.ip=127.0.0.1", "--ServerApp.open_browser=False",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             *(["--allow-root"] if os.geteuid() == 0 else []), *arguments],
            env=self.env, cwd=root, stdout=subprocess.DEVNULL, stderr=self._log_file)

    def api(self, path: str, method: str = "GET", body: object = None) -> Any:
        """The JSON answer of ``<base>/<path>`` (e.g. ``api/kernels``), with the token."""
        request = urllib.request.Request(
            f"{self.base}/{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        return json.loads(text) if text else None

    def wait_ready(self) -> None:
        def answers() -> bool:
            assert self.process.poll() is None, f"jupyter exited: {self.log.read_text()}"
            try:
                return bool(self.api("api/status"))
            except OSError:
                return False

        wait_for(answers, 60, "the jupyter server to answer")

    def close(self) -> None:
        """Stop the server; it shuts its kernels down on SIGTERM."""
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()
