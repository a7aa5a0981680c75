"""The page a Colab kernel serves (``%dashboard``, through the google.colab stub's
kernel-port iframe) follows the run of ``fit`` training in that kernel, in headless
Chromium: its progress (step of total), the ETA against Colab's session time left, and the
loss, learning-rate and validation curves drawn by uPlot; then how the run ended. A
screenshot is kept."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from browser import ARTIFACTS, browser_page, missing_requirements
from jupyter_client.blocking.client import BlockingKernelClient
from kernels import kernel, run

TESTS = Path(__file__).parent
STEPS = 24  # 3 epochs of 8 steps
SETUP = (f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
         "from fake_nvml import BOARDS, build_module\n"
         "sys.modules['pynvml'] = build_module(BOARDS['1xT4'])\n"
         "%load_ext ipycloud\n"
         "%dashboard --interval 0.5 --history 1m\n"
         "from google.colab import output\n"
         "import json\nprint(json.dumps(output.calls[-1]))")
TRAIN = ("import time, torch\n"
         "from torch import nn\n"
         "from torch.utils.data import DataLoader, TensorDataset\n"
         "import ipycloud\n"
         "from ipycloud.runtime.train.callback import Callback\n"
         "class Slowly(Callback):\n"
         "    def on_step(self, step, logs):\n"
         "        time.sleep(0.4)\n"
         "torch.manual_seed(0)\n"
         "inputs = torch.randn(64, 6)\n"
         "data = DataLoader(TensorDataset(inputs, inputs[:, :3].argmax(dim=1)), batch_size=8)\n"
         "model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))\n"
         "ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=3,\n"
         "             val_data=data, device='cpu', progress=False, log_every=1,\n"
         "             callbacks=[Slowly()], checkpoint='checkpoints')")


def start_training(page: Any, client: BlockingKernelClient) -> Any:
    """Once the page is live, start TRAIN in the kernel; the page's run section."""
    page.locator("body[data-ipycloud-status='live']").wait_for(timeout=20_000)
    client.execute(TRAIN)
    return page.locator("section.ipycloud-Run")


def wait_finished(page: Any, section: Any, timeout_s: float) -> None:
    """Wait until the run section says TRAIN finished, all its steps drawn."""
    section.and_(page.locator("[data-ipycloud-run-status='finished']")).wait_for(
        timeout=timeout_s * 1000)
    assert section.locator(".ipycloud-Run-figures").inner_text().startswith(
        f"step {STEPS}/{STEPS} (100%) · epoch 3/3")
    assert section.locator("[data-ipycloud-chart='loss']").get_attribute(
        "data-ipycloud-points") == str(STEPS)


@pytest.fixture(autouse=True)
def _browser_needed() -> None:
    if missing := missing_requirements():
        pytest.fail("the browser test needs " + "; ".join(missing))


def test_the_colab_page_shows_the_runs_progress_eta_and_curves(tmp_path: Path) -> None:
    env = {**os.environ, "COLAB_RELEASE_TAG": "release-colab_20261120-060000_RC00",
           "IPYCLOUD_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": os.pathsep.join([str(TESTS / "stubs"), os.environ.get("PYTHONPATH",
                                                                                "")])}
    with kernel(tmp_path, env=env) as (_, client), browser_page(1200, 900) as page:
        call = json.loads(run(client, SETUP).strip().splitlines()[-1])
        page.goto(f"http://127.0.0.1:{call['port']}{call['path']}")
        try:
            section = start_training(page, client)
            section.and_(page.locator("[data-ipycloud-run-status='running']")).wait_for(
                timeout=30_000)
            page.wait_for_function(
                "() => Number(document.querySelector('.ipycloud-Run')"
                ".getAttribute('data-ipycloud-run-step')) >= 10", timeout=30_000)
            figures = section.locator(".ipycloud-Run-figures").inner_text()
            assert re.match(rf"step \d+/{STEPS} \(\d+%\) · epoch [012]/3 · [\d.]+ steps/s · "
                            r"loss [\d.]+", figures), figures
            eta = section.locator(".ipycloud-Run-eta").inner_text()
            assert re.fullmatch(r"ETA \d+ s · session left 1[01] h \d\d min", eta), eta
            progress = section.locator("progress")
            assert progress.get_attribute("max") == str(STEPS)
            assert int(progress.evaluate("node => node.value")) >= 10
            for chart in ("loss", "lr"):
                holder = section.locator(f"[data-ipycloud-chart='{chart}']")
                assert int(holder.get_attribute("data-ipycloud-points") or 0) >= 10
                assert holder.locator("canvas").count() == 1  # drawn by uPlot
            assert section.locator("[data-ipycloud-chart='loss'] .u-legend").inner_text() \
                .count("smoothed") == 1
            page.screenshot(path=str(ARTIFACTS / "dashboard-webpage-run.png"), full_page=True)

            wait_finished(page, section, 60)
            validation = section.locator("[data-ipycloud-chart='validation']")
            assert validation.get_attribute("data-ipycloud-points") == "3"  # one per epoch
            assert "val_accuracy" in validation.locator(".u-legend").inner_text()
            page.screenshot(path=str(ARTIFACTS / "dashboard-webpage-run-finished.png"),
                            full_page=True)
            reply = client.get_shell_msg(timeout=60)
            assert reply["content"]["status"] == "ok"
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "dashboard-webpage-run-failure.png"),
                            full_page=True)
            raise
    assert (ARTIFACTS / "dashboard-webpage-run.png").stat().st_size > 10_000
