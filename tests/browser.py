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
def notebook_in_lab(tmp_path: Path, name: str, cells: Sequence[str]) -> Iterator[str]:
    """A notebook of code ``cells`` in a started JupyterLab; yields the notebook's URL."""
    import nbformat

    root = tmp_path / "root"
    root.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, root / name)
    with lab_server(tmp_path, root) as lab:
        yield f"{lab.base}/lab/tree/{name}?reset&token={lab.token}"


def run_all_cells(page: Any, url: str) -> None:
    """Open the notebook at ``url`` once its kernel is idle, and run all its cells."""
    page.goto(url)
    page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()


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
