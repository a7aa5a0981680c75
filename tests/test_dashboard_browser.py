"""The dashboard in a real JupyterLab, watched through headless Chromium.

A screenshot of the live panel is kept under ``$IPYCLOUD_TEST_ARTIFACTS`` (default
``<repo>/test-artifacts/``). Chromium, JupyterLab and playwright must be installed
(``scripts/test.sh`` sees to it): without them this test fails, it does not skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from waiting import wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(os.environ.get("IPYCLOUD_TEST_ARTIFACTS",
                                Path(__file__).parent.parent / "test-artifacts"))
NOTEBOOK = "dashboard.ipynb"


def missing_requirements() -> list[str]:
    missing = [] if Path(CHROMIUM).exists() else [f"Chromium at {CHROMIUM} (bash "
                                                  "scripts/test_browser.sh installs it)"]
    missing += [f"the Python package {name} (pip install -e '.[test]')"
                for name in ("jupyterlab", "playwright", "jupyterlab_widgets")
                if importlib.util.find_spec(name) is None]
    return missing


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture
def jupyter_lab(tmp_path: Path) -> Iterator[str]:
    """A JupyterLab server on a free port, with its own settings; yields its base URL + token."""
    if missing := missing_requirements():
        pytest.fail("the browser test needs " + "; ".join(missing))
    root = tmp_path / "root"
    root.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("%load_ext ipycloud"),
                      nbformat.v4.new_code_cell("%dashboard --interval 0.5 --history 20s")]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, root / NOTEBOOK)
    news = tmp_path / "settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))  # no news pop-up over the panel
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, **{name: str(tmp_path / folder) for name, folder in (
        ("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"))}}
    log = (tmp_path / "jupyter.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
         f"--IdentityProvider.token={token}", "--ServerApp.ip=127.0.0.1", "--LabApp.news_url=None",
         f"--ServerApp.root_dir={root}", *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(f"{base}/api/status?token={token}") or server.poll() is not None,
                 60, "JupyterLab to start")
        assert server.poll() is None, (tmp_path / "jupyter.log").read_text()
        yield f"{base}/lab/tree/{NOTEBOOK}?reset&token={token}"
    finally:
        request = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
        try:
            urllib.request.urlopen(request, timeout=5).close()  # shuts the kernels down too
            server.wait(20)
        except (OSError, subprocess.TimeoutExpired):
            server.kill()
            server.wait()
        log.close()


def test_jupyterlab_shows_the_panel_updating(jupyter_lab: str) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            page.goto(jupyter_lab)
            page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell").first.click()
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_text("Run All Cells", exact=True).click()

            panel = page.locator(".widget-vbox").filter(has_text="ipycloud")
            panel.wait_for(timeout=60_000)
            rows = panel.locator(".widget-hbox .widget-label").all_inner_texts()
            assert {"CPU", "RAM", "disk working"} <= set(rows)
            assert "live, every 0.5 s" in panel.inner_text()
            sparkline = panel.locator("polyline").first  # the CPU row's trace

            def trace() -> str | None:
                return sparkline.get_attribute("points")

            first = trace()
            wait_for(lambda: trace() != first and len((trace() or "").split()) >= 3, 20,
                     "the CPU sparkline to move in the browser")
            page.screenshot(path=str(ARTIFACTS / "dashboard-jupyterlab.png"))

            panel.get_by_role("button", name="Stop").click()  # a round trip to the kernel
            panel.get_by_text("stopped", exact=True).wait_for(timeout=20_000)
            frozen = trace()
            time.sleep(1.5)  # three intervals: a live panel would have moved
            assert trace() == frozen
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "dashboard-jupyterlab-failure.png"))
            raise
        finally:
            browser.close()
    assert (ARTIFACTS / "dashboard-jupyterlab.png").stat().st_size > 10_000

