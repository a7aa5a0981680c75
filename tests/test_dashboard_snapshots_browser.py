"""Notebooks reopened in a real JupyterLab (headless Chromium) once their kernel is gone show
the dashboard's snapshot where its live views were: one saved by another machine's run
(untrusted: JupyterLab removes its iframe), and one the user ran and saved in this
JupyterLab (trusted: the iframe of the kernel's own page stays hidden, as no live page answers in
it). Screenshots are kept."""

from __future__ import annotations

from pathlib import Path

import nbformat
from browser import ARTIFACTS, browser_page, lab_server
from kernels import execute
from test_dashboard_snapshots import dashboard_notebook
from waiting import wait_for

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def test_an_untrusted_notebook_shows_the_snapshots_of_the_page_and_the_panel(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    notebook = dashboard_notebook(tmp_path / "state", stop=False)
    notebook.cells += [nbformat.v4.new_code_cell(source) for source in (
        "panel = %dashboard --interval 0.5", "panel", "panel.stop()")]
    executed = execute(notebook, tmp_path)
    executed.metadata["kernelspec"] = KERNELSPEC
    nbformat.write(executed, root / "saved.ipynb")
    with lab_server(tmp_path, root) as lab, browser_page(1200, 1400) as page:
        try:
            page.goto(f"{lab.base}/lab/tree/saved.ipynb?reset&token={lab.token}")
            outputs = page.locator(".jp-Notebook .jp-OutputArea-output")
            snapshots = outputs.locator(".ipycloud-snapshot")
            snapshots.nth(1).wait_for(timeout=60_000)
            assert snapshots.count() == 2  # the page's and the panel's
            page_still, panel_still = snapshots.nth(0), snapshots.nth(1)
            assert page_still.is_visible() and panel_still.is_visible()
            assert "(shown where the live page is not)" in page_still.inner_text()
            assert "(the live panel stopped)" in panel_still.inner_text()
            assert "a1b2c3d4e5f6\trunning\ttrain.ipynb\t4/100" in page_still.inner_text()
            assert outputs.locator("iframe").count() == 0  # sanitized away
            assert "model not found" not in page.locator(".jp-Notebook").inner_text()
            page.screenshot(path=str(ARTIFACTS / "dashboard-snapshot-untrusted.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "dashboard-snapshot-untrusted-failure.png"))
            raise


def test_a_notebook_saved_with_a_live_page_shows_its_snapshot_once_the_kernel_is_gone(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    notebook = nbformat.v4.new_notebook()
    # The kernel's own page, as where the server has no ipycloud extension (the server's
    # page would still answer once the kernel is gone).
    notebook.cells = [nbformat.v4.new_code_cell(
        "import os\nos.environ.pop('IPYCLOUD_SERVER_PAGE')\n%load_ext ipycloud\n%dashboard --web")]
    notebook.metadata["kernelspec"] = KERNELSPEC
    nbformat.write(notebook, root / "live.ipynb")
    with lab_server(tmp_path, root) as lab, browser_page(1200, 1400) as page:
        try:
            page.goto(f"{lab.base}/lab/tree/live.ipynb?reset&token={lab.token}")
            page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell").first.click()
            page.keyboard.press("Shift+Enter")
            output = page.locator(".jp-Notebook .jp-OutputArea-output").first
            frame = output.locator("iframe")
            frame.wait_for(state="visible", timeout=60_000)  # the page said it is live
            assert output.locator(".ipycloud-snapshot").is_hidden()
            page.frame_locator(".jp-OutputArea-output iframe").locator(
                "body[data-ipycloud-status='live']").wait_for(timeout=20_000)

            (session,) = lab.api("api/sessions")
            lab.api(f"api/kernels/{session['kernel']['id']}", "DELETE")
            page.get_by_role("menuitem", name="File", exact=True).click()
            page.get_by_text("Save Notebook", exact=True).click()

            def saved_output() -> str | None:
                try:
                    outputs = nbformat.read(root / "live.ipynb", as_version=4).cells[0].outputs
                except ValueError:  # being written
                    return None
                return outputs[0].data["text/html"] if outputs else None

            assert "<iframe" in wait_for(saved_output, 20, "the notebook saved with its output")

            page.reload()
            output = page.locator(".jp-Notebook .jp-OutputArea-output").first
            still = output.locator(".ipycloud-snapshot")
            still.wait_for(state="visible", timeout=60_000)
            assert output.locator("iframe").count() == 1  # trusted: kept, but never shown
            page.wait_for_timeout(3_000)  # a live page would have said so by now
            assert still.is_visible() and output.locator("iframe").is_hidden()
            assert "(shown where the live page is not)" in still.inner_text()
            page.screenshot(path=str(ARTIFACTS / "dashboard-snapshot-kernel-gone.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "dashboard-snapshot-kernel-gone-failure.png"))
            raise

