"""``fit`` in a real kernel draws its curves as one output updated in place, from the main
thread only, however it was imported: ``ipycloud.fit``, or from the runtime's module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from kernels import cell_messages, drawings, kernel, stream

TRAINING = """
import torch
from torch import nn
torch.manual_seed(0)
inputs = torch.randn(64, 4)
batches = [(inputs[index:index + 8], inputs[index:index + 8, :2].argmax(1))
           for index in range(0, 64, 8)]
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""
FIT = "fit(model, optimizer, batches, epochs=2, val_data=batches[:2], device='cpu', log_every=2)"
IN_A_THREAD = f"""
import threading
worker = threading.Thread(target=lambda: {FIT})
worker.start()
worker.join()
"""


def messages(client: BlockingKernelClient, code: str) -> list[dict[str, Any]]:
    """The output messages ``code`` sent, until the kernel is idle again; fails on an error."""
    received, _ = cell_messages(client, code)
    for message in received:
        if message["msg_type"] == "error":
            raise AssertionError("\n".join(message["content"]["traceback"]))
    return received


def assert_drawn_in_place(found: list[tuple[str, str, str]]) -> None:
    kinds = [kind for kind, _, _ in found]
    assert kinds[0] == "display_data" and set(kinds[1:]) == {"update_display_data"}, kinds
    assert len({display_id for _, display_id, _ in found}) == 1
    assert "finished at step 16, epoch 2" in found[-1][2]


def test_curves_come_from_the_runtimes_fit_only_on_the_main_thread(tmp_path: Path) -> None:
    with kernel(tmp_path) as (_, client):
        messages(client, TRAINING + "from ipycloud.runtime.train.loop import fit")
        assert_drawn_in_place(drawings(messages(client, FIT)))  # no %load_ext, no ipycloud.fit
        messages(client, "%load_ext ipycloud")
        assert_drawn_in_place(drawings(messages(client, FIT)))  # drawn once, not twice
        threaded = messages(client, IN_A_THREAD)
        assert drawings(threaded) == []
        assert "epoch 1:" in stream(threaded, "stdout")  # it did train


def test_ipycloud_fit_draws_curves_without_ipywidgets_or_warnings(tmp_path: Path) -> None:
    with kernel(tmp_path) as (_, client):
        hide = "import sys\nsys.modules['ipywidgets'] = None\n"
        received = messages(client, hide + TRAINING + "import ipycloud\nipycloud." + FIT)
        assert_drawn_in_place(drawings(received))
        errors = stream(received, "stderr")
        assert "16/16" in errors  # tqdm's text bar
        assert "IProgress" not in errors and "Warning" not in errors
        assert not any("application/vnd.jupyter.widget-view+json" in message["content"]
                       .get("data", {}) for message in received)
