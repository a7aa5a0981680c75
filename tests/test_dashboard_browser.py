"""The dashboard in a real JupyterLab, watched through headless Chromium (``browser``),
until its Stop button leaves a snapshot in its place; a screenshot of the live panel is
kept as a test artefact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import ARTIFACTS, browser_page, notebook_in_lab, run_all_cells
from waiting import wait_for

NOTEBOOK = "dashboard.ipynb"


@pytest.fixture
def jupyter_lab(tmp_path: Path) -> Iterator[str]:
    """A JupyterLab server on a free port, with its own settings; yields the notebook's URL."""
    with notebook_in_lab(tmp_path, NOTEBOOK, ["%load_ext ipycloud",
                                              "%dashboard --interval 0.5 --history 20s"]) as url:
        yield url


def test_jupyterlab_shows_the_panel_updating(jupyter_lab: str) -> None:
    with browser_page() as page:
        try:
            run_all_cells(page, jupyter_lab)
            panel = page.locator(".widget-vbox").filter(has_text="ipycloud")
            panel.wait_for(timeout=60_000)
            rows = panel.locator(".widget-hbox .widget-label").all_inner_texts()
            assert {"CPU", "RAM"} <= set(rows) and any(row.startswith("disk working")
                                                      for row in rows)
            # labels and figures show in full (a row's last label, its detail, may be cut)
            cut = panel.locator(".widget-hbox > .widget-label:not(:last-child)").evaluate_all(
                "labels => labels.filter(label => label.scrollWidth > label.clientWidth)"
                ".map(label => label.textContent)")
            assert cut == []
            assert "live, every 0.5 s" in panel.inner_text()
            sparkline = panel.locator("polyline").first  # the CPU row's trace

            def trace() -> str | None:
                return sparkline.get_attribute("points")

            first = trace()
            wait_for(lambda: trace() != first and len((trace() or "").split()) >= 3, 20,
                     "the CPU sparkline to move in the browser")
            page.screenshot(path=str(ARTIFACTS / "dashboard-jupyterlab.png"))

            panel.get_by_role("button", name="Stop").click()  # a round trip to the kernel
            still = page.locator(".jp-OutputArea-output .ipycloud-snapshot")
            still.wait_for(timeout=20_000)  # in the panel's place, for the saved notebook
            assert "(the live panel stopped)" in still.inner_text()
            assert panel.count() == 0
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "dashboard-jupyterlab-failure.png"))
            raise
    assert (ARTIFACTS / "dashboard-jupyterlab.png").stat().st_size > 10_000

