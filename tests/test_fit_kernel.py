"""``fit`` in a real kernel: the Stop button pauses the run, and rerunning the cell continues."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from checkpoint_helpers import differences
from jupyter_client.blocking.client import BlockingKernelClient
from kernels import cell_messages, kernel, run

TRAINING_CELL = """\
import time, torch, ipycloud
from torch import nn
from torch.utils.data import DataLoader, Dataset
from ipycloud.runtime.train.callback import Callback

class Slow(Dataset):
    inputs = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return 64
    def __getitem__(self, index):
        time.sleep(0.005)
        return self.inputs[index] + torch.randn(6) * 0.1, self.inputs[index, :3].argmax()

class SaysStep2(Callback):
    def on_step(self, step, logs):
        if step == 2:
            print("step 2 done", flush=True)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
history = ipycloud.fit(model, optimizer, DataLoader(Slow(), batch_size=4, shuffle=True,
                                                    num_workers={workers}),
                       epochs=6, device="cpu", checkpoint={folder!r}, seed=1,
                       callbacks=[SaysStep2()])
torch.save(model.state_dict(), {out!r})
"""
STEP_LINE = "step 2 done"  # printed by the training cell's callback


def interrupted(manager: Any, client: BlockingKernelClient,
                code: str) -> tuple[str, list[str], str]:
    """Run ``code``, press Stop once it printed ``STEP_LINE``; (its text, the name and
    traceback lines of the error it showed, the status of its reply)."""
    texts: list[str] = []

    def stop_once_training(message: dict[str, Any]) -> None:
        if message["msg_type"] != "stream":
            return
        begun = STEP_LINE in "".join(texts)
        texts.append(message["content"]["text"])
        if not begun and STEP_LINE in "".join(texts):
            manager.interrupt_kernel()

    received, status = cell_messages(client, code, stop_once_training)
    error = [[message["content"]["ename"], *message["content"]["traceback"]]
             for message in received if message["msg_type"] == "error"]
    return "".join(texts), error[-1] if error else [], status


def test_the_stop_button_pauses_fit_and_the_rerun_continues_bit_for_bit(
        tmp_path: Path) -> None:
    paused = TRAINING_CELL.format(workers=1, folder=str(tmp_path / "paused"),
                                  out=str(tmp_path / "resumed.pt"))
    whole = TRAINING_CELL.format(workers=1, folder=str(tmp_path / "whole"),
                                 out=str(tmp_path / "whole.pt"))
    with kernel(tmp_path) as (manager, client):
        text, error, status = interrupted(manager, client, paused)
        assert status == "error" and error[0] == "FitInterrupted"
        assert "; rerun this cell to continue" in text
        shown = re.sub(r"\x1b\[[\d;]*m", "", "\n".join(error[1:]))  # without colours
        frames = re.findall(r"^(?:Cell In\[|File )", shown, flags=re.MULTILINE)
        assert len(frames) == 2, shown  # the cell's and fit's: none of the loop inside
        assert not (tmp_path / "resumed.pt").exists()
        assert "resuming from" in run(client, paused)
        run(client, whole)
    assert differences(torch.load(tmp_path / "resumed.pt", weights_only=True),
                       torch.load(tmp_path / "whole.pt", weights_only=True)) == []


def test_with_the_extension_an_interrupted_fit_ends_the_cell_with_its_line_alone(
        tmp_path: Path) -> None:
    cell = TRAINING_CELL.format(workers=0, folder=str(tmp_path / "run"),
                                out=str(tmp_path / "out.pt"))
    with kernel(tmp_path) as (manager, client):
        run(client, "%load_ext ipycloud")
        text, error, status = interrupted(manager, client, cell)
    assert status == "error"  # the cell failed: Run All stops there
    assert error == []  # no traceback
    assert re.search(r"\nipycloud\.fit: interrupted at step \d+; rerun this cell to "
                     r"continue\n$", text), text
