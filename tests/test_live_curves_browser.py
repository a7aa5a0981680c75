"""The live curves in a real JupyterLab, watched through headless Chromium (``browser``):
one chart area under the progress bar, redrawn in place while ``fit`` runs; a screenshot
of the finished run is kept as ``test-artifacts/live-curves-jupyterlab.png``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import ARTIFACTS, browser_page, notebook_in_lab, run_all_cells
from waiting import wait_for

NOTEBOOK = "curves.ipynb"
TRAINING = """\
import time, torch, ipycloud
from torch import nn

class Slow(torch.utils.data.Dataset):
    inputs = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return 512
    def __getitem__(self, index):
        time.sleep(0.0005)
        return self.inputs[index], self.inputs[index, :3].argmax()

torch.manual_seed(0)
data = torch.utils.data.DataLoader(Slow(), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=64 * 6)
history = ipycloud.fit(model, optimizer, data, epochs=6, val_data=list(data)[:8],
                       scheduler=scheduler, device="cpu", log_every=4)
"""


@pytest.fixture
def jupyter_lab(tmp_path: Path) -> Iterator[str]:
    """A JupyterLab server on a free port, with its own settings; yields the notebook's URL."""
    with notebook_in_lab(tmp_path, NOTEBOOK, [TRAINING]) as url:
        yield url


def test_jupyterlab_shows_the_curves_redrawn_in_place(jupyter_lab: str) -> None:
    with browser_page(width=1200, height=900) as page:
        try:
            run_all_cells(page, jupyter_lab)
            curves = page.locator(".ipycloud-curves")
            curves.first.wait_for(timeout=90_000)
            captions: set[str] = set()

            def caption() -> str:
                assert curves.count() == 1  # redrawn in place, never a second output
                text = curves.first.locator("div").first.inner_text()
                captions.add(text)
                return text

            wait_for(lambda: "finished at step 384" in caption(), 120,
                     "the run to finish in the browser")
            assert len(captions) >= 2  # seen while running, and at the end
            charts = curves.locator("svg").all()
            assert [chart.get_attribute("aria-label") for chart in charts] == [
                "loss", "learning rate", "val_accuracy"]
            assert charts[0].locator("polyline").count() == 3  # raw, smoothed, val_loss
            output = page.locator(".jp-Cell .jp-OutputArea").first
            output.screenshot(path=str(ARTIFACTS / "live-curves-jupyterlab.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "live-curves-jupyterlab-failure.png"))
            raise
    assert (ARTIFACTS / "live-curves-jupyterlab.png").stat().st_size > 10_000
