"""``fit`` in a real kernel: the Stop button pauses the run, and rerunning the cell continues."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from checkpoint_helpers import differences
from jupyter_client.blocking.client import BlockingKernelClient
from kernels import kernel, run

TRAINING_CELL = """\
import time, torch, ipycloud
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    inputs = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return 64
    def __getitem__(self, index):
        time.sleep(0.005)
        return self.inputs[index] + torch.randn(6) * 0.1, self.inputs[index, :3].argmax()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
history = ipycloud.fit(model, optimizer, DataLoader(Slow(), batch_size=4, shuffle=True,
                                                    num_workers={workers}),
                       epochs=6, device="cpu", checkpoint={folder!r}, seed=1)
torch.save(model.state_dict(), {out!r})
"""


def interrupted(manager: Any, client: BlockingKernelClient, code: str) -> tuple[str, str]:
    """Run ``code``, press Stop once training has begun; (its text, the error's name)."""
    message_id = client.execute(code)
    texts, error, stopped = [], "", False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        message = client.get_iopub_msg(timeout=deadline - time.monotonic())
        if message["parent_header"].get("msg_id") != message_id:
            continue
        content = message["content"]
        if message["msg_type"] == "stream":
            texts.append(content["text"])
            if not stopped and "ipycloud.fit: starting" in "".join(texts):
                time.sleep(0.5)
                manager.interrupt_kernel()
                stopped = True
        elif message["msg_type"] == "error":
            error = content["ename"]
        elif message["msg_type"] == "status" and content["execution_state"] == "idle":
            return "".join(texts), error
    raise AssertionError("the cell did not finish: " + "".join(texts))


def test_the_stop_button_pauses_fit_and_the_rerun_continues_bit_for_bit(
        tmp_path: Path) -> None:
    paused = TRAINING_CELL.format(workers=1, folder=str(tmp_path / "paused"),
                                  out=str(tmp_path / "resumed.pt"))
    whole = TRAINING_CELL.format(workers=1, folder=str(tmp_path / "whole"),
                                 out=str(tmp_path / "whole.pt"))
    with kernel(tmp_path) as (manager, client):
        text, error = interrupted(manager, client, paused)
        assert error == "KeyboardInterrupt"
        assert "; rerun this cell to continue" in text
        assert not (tmp_path / "resumed.pt").exists()
        assert "resuming from" in run(client, paused)
        run(client, whole)
    assert differences(torch.load(tmp_path / "resumed.pt", weights_only=True),
                       torch.load(tmp_path / "whole.pt", weights_only=True)) == []
