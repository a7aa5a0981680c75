"""A real Jupyter server in the test process with ipycloud's extension loaded, for the
test_server_* modules: ``from server_fixtures import *`` makes these fixtures (and
pytest-jupyter's) local to the importing module.

pytest-jupyter's plugin is not registered for the whole suite: its autouse fixtures (an
event loop per test, a ServerApp cleanup) and its test-call hook would reach every test.
Imported here, they reach only the server tests, which are plain functions that drive the
server's loop through ``Api``.

The server reads a fake cgroup tree (``system_root``) and the board the ``board_name``
fixture names (override it with ``@pytest.mark.parametrize("board_name", [...])``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from api_schema import check_route
from cgroup_files import make_v2
from fake_nvml import BOARDS, FakeBoard
from pytest_jupyter.jupyter_core import (  # noqa: F401
    echo_kernel_spec,
    jp_asyncio_loop,
    jp_config_dir,
    jp_data_dir,
    jp_env_config_path,
    jp_env_jupyter_path,
    jp_environ,
    jp_home_dir,
    jp_kernel_dir,
    jp_runtime_dir,
    jp_system_config_path,
    jp_system_jupyter_path,
)
from pytest_jupyter.jupyter_server import (  # noqa: F401
    jp_argv,
    jp_auth_header,
    jp_base_url,
    jp_configurable_serverapp,
    jp_create_notebook,
    jp_fetch,
    jp_http_port,
    jp_logging_stream,
    jp_nbconvert_templates,
    jp_root_dir,
    jp_server_cleanup,
    jp_serverapp,
    jp_template_dir,
    jp_web_app,
)
from pytest_jupyter.pytest_tornasync import (  # noqa: F401
    http_server,
    http_server_client,
    http_server_port,
)
from tornado.httpclient import HTTPResponse
from traitlets.config import Config

from ipycloud.runtime.monitor.webpage import SERVER_PAGE_ENV

T = TypeVar("T")
MIB = 2**20
RAM_LIMIT = 1024 * MIB
INTERVAL = 0.2  # the server's sampling interval in these tests

# The fake cgroup v2 tree: a 1 GiB, one-core container.
CGROUP_FILES = {
    "memory.max": f"{RAM_LIMIT}\n",
    "memory.current": f"{300 * MIB}\n",
    "memory.stat": f"inactive_file {44 * MIB}\n",
    "memory.peak": f"{400 * MIB}\n",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    "cpu.max": "100000 100000\n",
    "cpu.stat": "usage_usec 1000000\nnr_periods 1000\nnr_throttled 10\nthrottled_usec 5\n",
}


@pytest.fixture
def board_name() -> str:
    """The fake NVML board of the server (a name in fake_nvml.BOARDS)."""
    return "1xT4"


@pytest.fixture
def fake_board(board: Callable[[str | FakeBoard], Any], board_name: str) -> FakeBoard:
    """A copy of the named board, installed in place of pynvml; the test may change its
    GPUs' process tables while the server runs."""
    named = BOARDS[board_name]
    copy = replace(named, gpus=[replace(gpu) for gpu in named.gpus])
    board(copy)
    return copy


@pytest.fixture
def system_root(tmp_path: Path) -> Path:
    """The folder holding the server's fake /proc/self/cgroup and /sys/fs/cgroup."""
    root = tmp_path / "system"
    make_v2(root, dict(CGROUP_FILES))
    return root


@pytest.fixture
def server_extra_config() -> dict[str, Any]:
    """More server configuration, for tests that parametrize it."""
    return {}


@pytest.fixture
def jp_server_config(fake_board: FakeBoard, system_root: Path,
                     server_extra_config: dict[str, Any],
                     monkeypatch: pytest.MonkeyPatch) -> Config:
    """ipycloud's extension on a server that refuses unauthenticated access and fails
    loudly when an extension does not load; restarts noticed within half a second. The
    page's path the extension puts in the environment for its kernels is gone after the
    test (the server runs in the test process)."""
    monkeypatch.setenv(SERVER_PAGE_ENV, "")  # remembered as it was, to be put back
    monkeypatch.delenv(SERVER_PAGE_ENV)
    config = Config({
        "ServerApp": {
            # Terminals are off: their websocket handler trips the check this asks for.
            "jpserver_extensions": {"ipycloud.server": True, "jupyter_server_terminals": False},
            "allow_unauthenticated_access": False,
            "reraise_server_extension_failures": True,
        },
        "IpycloudServer": {"interval": INTERVAL, "system_root": str(system_root)},
        "KernelRestarter": {"time_to_dead": 0.5},
    })
    config.merge(Config(server_extra_config))
    return config


def cgroup_file(system_root: Path, name: str) -> Path:
    """A file of the fake cgroup tree, to change while the server runs."""
    return system_root / "sys/fs/cgroup" / name


class Api:
    """Requests to the server's ipycloud routes, run on the server's own event loop."""

    def __init__(self, fetch: Callable[..., Any], loop: asyncio.AbstractEventLoop) -> None:
        self._fetch, self._loop = fetch, loop

    def run(self, awaitable: Any) -> Any:
        """Run ``awaitable`` on the server's loop (the server serves while it runs)."""
        return self._loop.run_until_complete(awaitable)

    def response(self, *path: str, **kwargs: Any) -> HTTPResponse:
        """The raw response of a request, whatever its status."""
        response: HTTPResponse = self.run(self._fetch(*path, raise_error=False, **kwargs))
        return response

    def get(self, route: str, *, params: dict[str, str] | None = None) -> Any:
        """GET an ipycloud route that must answer 200 with JSON; its decoded body."""
        response = self.response("ipycloud", "api", *route.split("/"), params=params)
        assert response.code == 200, (response.code, response.body)
        assert response.headers["Content-Type"] == "application/json"
        return check_route(route, json.loads(response.body))

    def post(self, *path: str, body: dict[str, Any]) -> Any:
        """POST JSON to a route of the server itself (sessions, kernels)."""
        response = self.response(*path, method="POST", body=json.dumps(body))
        assert response.code in (200, 201), (response.code, response.body)
        return json.loads(response.body)

    def wait(self, condition: Callable[[], T], timeout: float = 20.0,
             what: str = "the condition") -> T:
        """Poll ``condition`` while the server runs, until it returns something true."""
        deadline = self._loop.time() + timeout
        while not (result := condition()):
            assert self._loop.time() < deadline, f"timed out waiting for {what}"
            self.run(asyncio.sleep(INTERVAL / 2))
        return result


@pytest.fixture
def api(jp_fetch: Any, jp_asyncio_loop: asyncio.AbstractEventLoop) -> Api:  # noqa: F811
    """The server with ipycloud loaded, and requests to it."""
    return Api(jp_fetch, jp_asyncio_loop)
