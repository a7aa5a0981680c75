"""``%dashboard --web`` in a kernel that a real Jupyter server started (behind a JupyterHub-like
base URL) shows the page that server serves under its own authentication, so a browser that
reaches the server but not the kernel's machine sees it: the page and the routes it asks
for answer with the server's token and 403 without it; in headless Chromium, through the
server only, the page follows the kernel's run of ``fit``."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
from browser import ARTIFACTS, browser_page, missing_requirements
from jupyter_process import JupyterProcess
from kernels import run, session_kernel
from test_webpage_runs_browser import start_training, wait_finished
from waiting import wait_for

BASE_URL = "/user/ada/"


def status(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def answers(server: JupyterProcess) -> bool:
    assert server.process.poll() is None, f"jupyter exited: {server.log.read_text()}"
    try:
        return bool(server.api(f"{BASE_URL.strip('/')}/api/status"))
    except OSError:
        return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[JupyterProcess]:
    (tmp_path / "home").mkdir()
    server = JupyterProcess(tmp_path / "home", tmp_path,
                            arguments=[f"--ServerApp.base_url={BASE_URL}"],
                            env={"IPYCLOUD_STATE_DIR": str(tmp_path / "state")})
    try:
        wait_for(lambda: answers(server), 60, "the jupyter server to answer")
        yield server
    finally:
        server.close()


def test_dashboard_web_shows_the_servers_page_which_needs_the_servers_token(
        server: JupyterProcess) -> None:
    with session_kernel(server, "train.ipynb", BASE_URL) as (kernel_id, client):
        src = run(client, "%load_ext ipycloud\nview = %dashboard --web --history 2m\n"
                          "print(view.url)").strip()
        html = run(client, "print(view._repr_html_())")

    url = urlsplit(src)
    assert (url.scheme, url.netloc, url.path) == ("", "", f"{BASE_URL}ipycloud/page")
    assert parse_qs(url.query) == {"history": ["120"], "kernel": [kernel_id]}
    assert f'src="{src.replace("&", "&amp;")}"' in html
    page = f"{server.base}{src}"

    code, content_type, body = status(f"{page}&token={server.token}")
    assert (code, content_type) == (200, "text/html; charset=utf-8")
    assert body.startswith(b"<!doctype html>") and b"ipycloud-Run" in body
    assert status(page)[0] == 403
    assert status(page, {"Authorization": "token not-the-token"})[0] == 403

    # What the page asks for, relative to its own address, are the server's routes.
    for route in ("api/reading", "api/history?since=0"):
        asked = urljoin(page, route)
        assert asked.startswith(f"{server.base}{BASE_URL}ipycloud/api/")
        code, content_type, _ = status(asked, {"Authorization": f"token {server.token}"})
        assert (code, content_type) == (200, "application/json")
        assert status(asked)[0] == 403


def test_through_the_server_the_page_follows_the_kernels_run(server: JupyterProcess) -> None:
    if missing := missing_requirements():
        pytest.fail("the browser test needs " + "; ".join(missing))
    with (session_kernel(server, "train.ipynb", BASE_URL) as (_, client),
          browser_page(1200, 900) as page):
        src = run(client, "%load_ext ipycloud\nview = %dashboard --web\nprint(view.url)").strip()
        page.goto(f"{server.base}{src}&token={server.token}")
        try:
            wait_finished(page, start_training(page, client), 90)
            page.screenshot(path=str(ARTIFACTS / "dashboard-server-page-run.png"),
                            full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "dashboard-server-page-failure.png"),
                            full_page=True)
            raise
        reply = client.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "ok"
