"""A run of ``fit`` in JupyterLab, watched through headless Chromium: the panel's Runs
section follows it, across a reload of the page while the kernel is busy in its cell, and
the chart view draws its loss with axes and values under the cursor. A second run, one of
another machine whose log lies in a synced folder under the server's root, will not finish
before its session ends: its row says so, and names the machine.

The lab extension is this checkout's build (``ipycloud/labextension/``), put first on
``JUPYTER_PATH``. Screenshots are kept as test artefacts (``browser.ARTIFACTS``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser import ARTIFACTS, browser_page, lab_server
from jupyter_process import JupyterProcess
from waiting import wait_for

LAUNCHER = Path(__file__).parent / "fake_gpu_jupyter.py"
BUILT_EXTENSION = Path(__file__).parent.parent / "ipycloud" / "labextension"
NOTEBOOK = "train model.ipynb"  # a space, as users' names have
REMOTE_RUN = "0123456789ab"
# About a minute of training on the CPU: 600 steps, each slowed to 0.1 s by a callback, in
# 6 epochs with validation, checkpoints in the notebook's folder (under the server's root).
TRAINING = """\
import time
import torch
import ipycloud
from ipycloud.runtime.train.callback import Callback

class Slow(Callback):
    def on_step(self, step, logs):
        time.sleep(0.1)

torch.manual_seed(0)
inputs = torch.randn(400, 8)
targets = inputs.sum(dim=1, keepdim=True) + 0.3 * torch.randn(400, 1)
batches = [(inputs[i:i + 4], targets[i:i + 4]) for i in range(0, 400, 4)]
model = torch.nn.Linear(8, 1)
history = ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.01), batches,
                       epochs=6, val_data=batches[:5], loss_fn=torch.nn.functional.mse_loss,
                       checkpoint="checkpoints", log_every=5, callbacks=[Slow()])
"""


def write_remote_run(folder: Path, now: float) -> None:
    """The log of a run on another machine: an hour of session left, a day of steps to go."""
    start = {"t": now - 60, "kind": "start", "run": REMOTE_RUN, "pid": 42, "host": "elsewhere",
             "kernel": None, "notebook": "remote.ipynb", "platform": "Kaggle",
             "session_left_s": 3660.0, "device": "cuda:0", "precision": "bf16",
             "model": "ResNet", "parameters": 11_000_000, "optimizer": "AdamW",
             "batch_size": 64, "grad_accum": 1, "world_size": 1,
             "versions": {"ipycloud": "0.1.0", "torch": "2.13.0"}, "step": 0, "epoch": 0,
             "total_steps": 86_500, "epochs": 10, "max_steps": None, "folder": str(folder)}
    step = {"t": now - 1, "kind": "step", "step": 100, "epoch": 0, "loss": 2.5, "lr": 0.001,
            "steps_per_s": 1.0, "samples_per_s": 64.0}
    logs = folder / ".ipycloud-runs"
    logs.mkdir(parents=True)
    (logs / f"{REMOTE_RUN}.jsonl").write_text("".join(json.dumps(line) + "\n"
                                                      for line in (start, step)))


@dataclass
class Lab:
    server: JupyterProcess

    def url(self, path: str) -> str:
        return f"{self.server.base}/{path}?token={self.server.token}"

    def saved_layout(self) -> str:
        """The workspaces JupyterLab saved, as JSON text: what a reload restores."""
        return json.dumps(self.server.api("lab/api/workspaces"))


@pytest.fixture
def jupyter_lab(tmp_path: Path) -> Iterator[Lab]:
    assert (BUILT_EXTENSION / "package.json").exists(), (
        "the test needs the lab extension built: cd labextension && jlpm build")
    extensions = tmp_path / "jupyter-path" / "labextensions"
    extensions.mkdir(parents=True)
    (extensions / "ipycloud").symlink_to(BUILT_EXTENSION)
    root = tmp_path / "root"
    root.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(TRAINING)]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, root / NOTEBOOK)
    write_remote_run(root / "synced" / "checkpoints", time.time())
    env = {"IPYCLOUD_TEST_BOARD": "2xA100-MIG",
           "IPYCLOUD_TEST_GPU_PROCESSES": str(tmp_path / "gpu-processes.json"),
           "JUPYTER_PATH": str(tmp_path / "jupyter-path"),
           "IPYCLOUD_STATE_DIR": str(tmp_path / "state")}
    arguments = ["--IpycloudServer.interval=0.5"]
    with lab_server(tmp_path, root, "lab", arguments, env, LAUNCHER) as server:
        yield Lab(server)


def step_of(row: Any) -> int:
    return int(row.get_attribute("data-ipycloud-run-step") or -1)


def points(chart: Any) -> int:
    return int(chart.get_attribute("data-ipycloud-points") or 0)


def test_a_run_shows_live_in_the_panel_and_its_charts_across_a_reload(jupyter_lab: Lab) -> None:
    lab = jupyter_lab
    with browser_page(height=1000) as page:
        try:
            page.goto(lab.url(f"lab/tree/{NOTEBOOK}"))
            status_bar = page.locator("#jp-main-statusbar")
            status_bar.get_by_text("Idle").wait_for(timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
            page.keyboard.press("Shift+Enter")
            status_bar.get_by_text("Busy").wait_for(timeout=20_000)

            page.locator("#ipycloud-status").click()
            panel = page.locator("#ipycloud-panel")
            row = panel.locator('[data-ipycloud-run-status="running"]').filter(
                has=page.locator(".ipycloud-Run-name", has_text=NOTEBOOK))
            row.wait_for(timeout=60_000)
            remote = panel.locator(f'[data-ipycloud-run-id="{REMOTE_RUN}"]')
            assert remote.get_attribute("data-ipycloud-late") == "true"
            host = remote.locator('[data-ipycloud-run-field="host"]')
            assert (host.inner_text(), host.is_visible()) == ("on elsewhere", True)
            here = row.locator('[data-ipycloud-run-field="host"]')
            assert (here.inner_text(), here.is_visible()) == ("", False)  # this machine's
            eta = remote.locator('[data-ipycloud-run-field="eta"]').inner_text()
            # 86 400 steps at 1 step/s, against what is left of the hour the session had
            assert re.fullmatch(r"ETA 24 h 00 min — session ends in (1 h 00|[1-5]?\d) min: "
                                r"will not finish", eta), eta
            wait_for(lambda: step_of(row) > 0, 30, "the run's first logged step")
            row.locator('[data-ipycloud-action="open-run-chart"]').click()
            loss = page.locator('.ipycloud-ChartView [data-ipycloud-chart="loss"]')
            wait_for(lambda: points(loss) >= 2, 30, "the loss chart's points")

            wait_for(lambda: "ipycloud-chart:" in lab.saved_layout(), 20,
                     "JupyterLab to save the layout with the chart view")
            page.reload()  # the kernel goes on in its cell
            row.wait_for(timeout=60_000)  # the panel is back, and asks again
            before = step_of(row)
            wait_for(lambda: step_of(row) > before, 30, "the run's step to grow after the reload")
            assert row.get_attribute("data-ipycloud-run-status") == "running"
            progress = row.locator('[data-ipycloud-run-field="progress"]').inner_text()
            assert re.fullmatch(r"step \d+/600 · epoch [1-6]/6", progress), progress
            assert row.locator('[data-ipycloud-run-field="eta"]').inner_text().startswith("ETA ")
            panel.screenshot(path=str(ARTIFACTS / "lab-runs-panel.png"))

            loss.wait_for(timeout=30_000)  # the chart view is restored with the layout
            shown = points(loss)
            wait_for(lambda: points(loss) > shown, 30, "the restored chart to grow")
            assert loss.locator(".u-axis").count() == 2
            plot = loss.locator(".u-over")
            box = plot.bounding_box()
            assert box is not None
            page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)
            legend = loss.locator(".u-legend .u-series")
            values = [legend.nth(i).locator(".u-value").inner_text() for i in range(3)]
            assert re.fullmatch(r"\d+", values[0]), values  # the step under the cursor
            for value in values[1:]:  # loss and smoothed loss there
                float(value)
            page.screenshot(path=str(ARTIFACTS / "lab-runs-chart.png"))

            page.locator('[data-ipycloud-axis-choice="time"]').click()
            timed = page.locator('.ipycloud-ChartView [data-ipycloud-chart="loss"]'
                                 '[data-ipycloud-axis="time"]')
            wait_for(lambda: points(timed) >= 2, 10, "the loss over time")

            panel.locator('[data-ipycloud-action="open-machine-chart"]').click()
            gpus = page.locator('.ipycloud-ChartView [data-ipycloud-chart="gpu-utilization"]')
            wait_for(lambda: points(gpus) >= 2, 30, "the machine's GPU chart")
            assert gpus.locator(".u-legend .u-series").count() == 3  # time, GPU 0, GPU 1
            page.screenshot(path=str(ARTIFACTS / "lab-runs-machine-chart.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "lab-runs-failure.png"))
            raise
