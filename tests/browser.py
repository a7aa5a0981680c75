"""JupyterLab (or Notebook 7) in a subprocess, watched through Debian's headless Chromium.

Screenshots are kept under ``$IPYCLOUD_TEST_ARTIFACTS`` (default ``<repo>/test-artifacts/``).
Chromium, JupyterLab and playwright must be installed (``scripts/test.sh`` sees to it):
without them a browser test fails, it does not skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from jupyter_process import JupyterProcess

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(os.environ.get("IPYCLOUD_TEST_ARTIFACTS",
                                Path(__file__).parent.parent / "test-artifacts"))


def missing_requirements() -> list[str]:
    missing = [] if Path(CHROMIUM).exists() else [f"Chromium at {CHROMIUM} (bash "
                                                  "scripts/test_browser.sh installs it)"]
    missing += [f"the Python package {name} (pip install -e '.[test]')"
                for name in ("jupyterlab", "playwright", "jupyterlab_widgets")
                if importlib.util.find_spec(name) is None]
    return missing


@contextlib.contextmanager
def lab_server(home: Path, root: Path, app: str = "lab", arguments: Sequence[str] = (),
               env: dict[str, str] | None = None,
               launcher: Path | None = None) -> Iterator[JupyterProcess]:
    """A started ``jupyter <app>`` without news pop-ups; shut down (kernels too) afterwards."""
    if missing := missing_requirements():
        pytest.fail("the browser test needs " + "; ".join(missing))
    news = home / "settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    news.parent.mkdir(parents=True, exist_ok=True)
    news.write_text(json.dumps({"fetchNews": "false"}))  # no news pop-up over the page
    server = JupyterProcess(home, root, app, ["--LabApp.news_url=None", *arguments], env,
                            launcher)
    try:
        server.wait_ready()
        yield server
    finally:
        request = urllib.request.Request(f"{server.base}/api/shutdown?token={server.token}",
                                         method="POST")
        try:
            urllib.request.urlopen(request, timeout=5).close()  # shuts the kernels down too
            server.process.wait(20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        server.close()


@contextlib.contextmanager
def browser_page(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A page of a fresh headless Chromium."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()
