"""``%dashboard --web`` in a kernel that a real Jupyter server started (behind a JupyterHub-like
base URL) shows the page that server serves under its own authentication, so a browser that
reaches the server but not the kernel's machine sees it: the page and the routes it asks
for answer with the server's token and 403 without it; in headless Chromium, through the
server only, the page follows the kernel's run of ``fit``."""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
from browser import ARTIFACTS, browser_page, missing_requirements
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_process import JupyterProcess
from kernels import run
from test_webpage_runs_browser import STEPS, TRAIN
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


@contextlib.contextmanager
def notebook_kernel(server: JupyterProcess) -> Iterator[tuple[str, BlockingKernelClient]]:
    """A kernel the server started for a notebook, and a client of it."""
    session = server.api(f"{BASE_URL.strip('/')}/api/sessions", "POST", {
        "path": "train.ipynb", "type": "notebook", "name": "", "kernel": {"name": "python3"}})
    kernel_id = session["kernel"]["id"]
    client = BlockingKernelClient(connection_file=str(
        Path(server.env["JUPYTER_RUNTIME_DIR"]) / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield kernel_id, client
    finally:
        client.stop_channels()


def test_dashboard_web_shows_the_servers_page_which_needs_the_servers_token(
        server: JupyterProcess) -> None:
    with notebook_kernel(server) as (kernel_id, client):
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
    with notebook_kernel(server) as (kernel_id, client), browser_page(1200, 900) as page:
        src = run(client, "%load_ext ipycloud\nview = %dashboard --web\nprint(view.url)").strip()
        page.goto(f"{server.base}{src}&token={server.token}")
        try:
            page.locator("body[data-ipycloud-status='live']").wait_for(timeout=20_000)
            client.execute(TRAIN)
            section = page.locator("section.ipycloud-Run")
            section.and_(page.locator("[data-ipycloud-run-status='finished']")).wait_for(
                timeout=90_000)
            assert section.locator(".ipycloud-Run-figures").inner_text().startswith(
                f"step {STEPS}/{STEPS} (100%) · epoch 3/3")
            assert section.locator("[data-ipycloud-chart='loss']").get_attribute(
                "data-ipycloud-points") == str(STEPS)
            page.screenshot(path=str(ARTIFACTS / "dashboard-server-page-run.png"),
                            full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "dashboard-server-page-failure.png"),
                            full_page=True)
            raise
        reply = client.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "ok"
