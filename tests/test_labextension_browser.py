"""The lab extension in a real JupyterLab and Notebook 7, watched through headless Chromium.

The server process sees a fake board of two A100s (``fake_gpu_jupyter.py``) and a fake
cgroup tree; its kernels are real. Screenshots of the status bar, the panel and the
out-of-memory notification are kept as test artefacts (``browser.ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser import ARTIFACTS, browser_page, lab_server
from cgroup_files import make_v2
from jupyter_process import JupyterProcess
from waiting import wait_for

LAUNCHER = Path(__file__).parent / "fake_gpu_jupyter.py"
NOTEBOOK = "train.ipynb"
MIB = 2**20
RAM_LIMIT = 1024 * MIB
KERNEL_GPU_MIB = 2048
RAM_TEXT = "RAM 256/1024 MiB"  # the status bar under the container below
CGROUP_FILES = {  # a 1 GiB, one-core container
    "memory.max": f"{RAM_LIMIT}\n", "memory.current": f"{300 * MIB}\n",
    "memory.stat": f"inactive_file {44 * MIB}\n", "memory.peak": f"{400 * MIB}\n",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    "cpu.max": "100000 100000\n",
    "cpu.stat": "usage_usec 1000000\nnr_periods 1000\nnr_throttled 10\nthrottled_usec 5\n"}


@dataclass
class Lab:
    server: JupyterProcess
    system_root: Path  # the fake cgroup tree the server reads
    gpu_processes: Path  # the fake board's process table

    def url(self, path: str) -> str:
        return f"{self.server.base}/{path}?reset&token={self.server.token}"

    def kernel(self) -> dict[str, Any]:
        """The notebook's kernel as the ipycloud kernels route describes it."""
        kernels = self.server.api("ipycloud/api/kernels")["kernels"]
        (kernel,) = [entry for entry in kernels if entry["path"] == NOTEBOOK]
        return dict(kernel)


def start(tmp_path: Path, app: str) -> Iterator[Lab]:
    root, system_root = tmp_path / "root", tmp_path / "system"
    root.mkdir()
    make_v2(system_root, CGROUP_FILES)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("import os\nos.getpid()")]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, root / NOTEBOOK)
    processes = tmp_path / "gpu-processes.json"
    env = {"IPYCLOUD_TEST_BOARD": "2xA100-MIG", "IPYCLOUD_TEST_GPU_PROCESSES": str(processes)}
    arguments = [f"--IpycloudServer.system_root={system_root}", "--IpycloudServer.interval=0.5",
                 "--KernelRestarter.time_to_dead=0.5"]
    with lab_server(tmp_path, root, app, arguments, env, LAUNCHER) as server:
        yield Lab(server, system_root, processes)


@pytest.fixture
def jupyter_lab(tmp_path: Path) -> Iterator[Lab]:
    yield from start(tmp_path, "lab")


@pytest.fixture
def notebook_7(tmp_path: Path) -> Iterator[Lab]:
    yield from start(tmp_path, "notebook")


def points(sparkline: Any) -> int:
    return int(sparkline.get_attribute("data-ipycloud-points") or 0)


def test_jupyterlab_shows_gpus_kernels_and_an_out_of_memory_death(jupyter_lab: Lab) -> None:
    lab = jupyter_lab
    with browser_page(height=1300) as page:  # the whole panel, kernels table included
        try:
            page.goto(lab.url(f"lab/tree/{NOTEBOOK}"))
            page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=60_000)

            status = page.locator("#ipycloud-status")
            for index in ("0", "1"):
                status.locator(f'[data-ipycloud-gpu="{index}"]').wait_for(timeout=20_000)
            # 256 MiB used (memory.current less inactive_file) under a 1 GiB limit
            assert status.locator('[data-ipycloud-part="ram"]').inner_text() == RAM_TEXT
            page.locator("#jp-main-statusbar").screenshot(
                path=str(ARTIFACTS / "labextension-statusbar.png"))

            kernel = lab.kernel()
            lab.gpu_processes.write_text(json.dumps({"0": [[kernel["pid"], KERNEL_GPU_MIB]]}))
            status.click()
            panel = page.locator("#ipycloud-panel")
            panel.wait_for(timeout=20_000)
            assert panel.locator("[data-ipycloud-gpu]").count() == 2
            sparkline = panel.locator('[data-ipycloud-gpu="0"] [data-ipycloud-sparkline="memory"]')
            first = points(sparkline)
            wait_for(lambda: points(sparkline) >= first + 3, 20, "the sparklines to grow")
            row = panel.locator(f'[data-ipycloud-kernel-path="{NOTEBOOK}"]')
            wait_for(lambda: "2.0 GiB" in row.inner_text(), 20,
                     "the notebook's GPU memory in the kernels table")
            check_machine_rows(panel)
            panel.screenshot(path=str(ARTIFACTS / "labextension-panel.png"))
            page.screenshot(path=str(ARTIFACTS / "labextension-jupyterlab.png"))

            events = lab.system_root / "sys/fs/cgroup/memory.events"
            events.write_text(events.read_text().replace("oom_kill 0", "oom_kill 1"))
            os.kill(kernel["pid"], signal.SIGKILL)
            toast = page.get_by_text(f"the kernel of {NOTEBOOK} was killed: out of memory",
                                     exact=False)
            toast.first.wait_for(timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "labextension-out-of-memory.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "labextension-failure.png"))
            raise


def check_machine_rows(panel: Any) -> None:
    """RAM in the limit's unit, the Jupyter server's and its kernel's memory, and a row
    per file system saying what can still be written."""
    ram = panel.locator('[data-ipycloud-metric="ram"] .ipycloud-Metric-value')
    assert ram.inner_text() == "256/1024 MiB (25%)"
    jupyter = panel.locator('[data-ipycloud-metric="jupyter"]')
    figures = re.fullmatch(r"server (\d+) · kernels (\d+) MiB",
                           jupyter.locator(".ipycloud-Metric-value").inner_text())
    assert figures is not None and int(figures[1]) > 20 and int(figures[2]) > 20
    disks = panel.locator("[data-ipycloud-disk]")
    devices = []
    for index in range(disks.count()):
        disk = disks.nth(index)
        text = disk.locator(".ipycloud-Metric-value").inner_text()
        assert re.fullmatch(r"[\d.]+ (MiB|GiB|TiB) free of [\d.]+ \1", text), text
        folders = dict(line.split(": ", 1) for line in
                       (disk.get_attribute("title") or "").splitlines())
        assert list(folders) == disk.get_attribute("data-ipycloud-disk").split(", ")
        (device,) = {os.stat(folder).st_dev for folder in folders.values()}  # one each
        devices.append(device)
    assert devices and len(set(devices)) == len(devices)


def test_notebook_7_shows_the_gpus_and_ram(notebook_7: Lab) -> None:
    with browser_page() as page:
        try:
            page.goto(notebook_7.url(f"notebooks/{NOTEBOOK}"))
            status = page.locator("#ipycloud-status")
            for index in ("0", "1"):
                status.locator(f'[data-ipycloud-gpu="{index}"]').wait_for(timeout=60_000)
            assert status.locator('[data-ipycloud-part="ram"]').inner_text() == RAM_TEXT
            page.screenshot(path=str(ARTIFACTS / "labextension-notebook7.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "labextension-notebook7-failure.png"))
            raise


def test_the_settings_editor_names_the_status_bar_figures(jupyter_lab: Lab) -> None:
    """JupyterLab 4's settings form shows no title for a multi-select list: the figures are
    a list of labelled choices under its title."""
    with browser_page(height=1200) as page:
        try:
            page.goto(jupyter_lab.url("lab"))
            page.locator("#ipycloud-status").wait_for(timeout=60_000)
            page.keyboard.press("Control+,")
            page.get_by_text("ipycloud resources", exact=True).first.click()
            field = page.locator(".field-array").filter(
                has=page.locator('[id$="plugin_statusBar-title"]'))
            field.wait_for(timeout=20_000)
            assert field.locator("legend").first.inner_text() == "Status bar figures"
            choices = field.locator("select").first.locator("option").all_inner_texts()
            assert [choice for choice in choices if choice] == [
                "GPU utilisation (% busy, per GPU)", "GPU memory (used of total, per GPU)",
                "RAM (used of the container's limit)", "CPU (% of the usable cores)"]
            field.screenshot(path=str(ARTIFACTS / "labextension-settings.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "labextension-settings-failure.png"))
            raise


@pytest.mark.parametrize(("settings", "refused"), [
    ({"refreshInterval": 0.001}, "refreshInterval"),
    ({"refreshInterval": 86400}, "refreshInterval"),
    ({"ramWarningPercent": 400}, "ramWarningPercent"),
    ({"statusBar": ["gpu-memory", "fan-speed"]}, "statusBar"),
    ({"refreshIntervall": 2}, "refreshIntervall"),
])
def test_absurd_settings_are_refused_with_a_4xx(jupyter_lab: Lab, settings: dict[str, Any],
                                                refused: str) -> None:
    url = "lab/api/settings/ipycloud:plugin"
    with pytest.raises(urllib.error.HTTPError) as refusal:
        jupyter_lab.server.api(url, "PUT", {"raw": json.dumps(settings)})
    assert refusal.value.code == 400
    assert refused in refusal.value.read().decode()
    jupyter_lab.server.api(url, "PUT", {"raw": json.dumps({"refreshInterval": 5})})
    assert jupyter_lab.server.api(url)["settings"]["refreshInterval"] == 5
