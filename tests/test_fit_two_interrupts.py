"""Two interrupts 50 ms apart stop ``fit`` at once: its record and its last line say
that the step it stopped at was not saved, and which checkpoint a rerun continues from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ipycloud.runtime.runs import runs

TIMEOUT_S = 240

SCRIPT = """\
import sys, time
import torch, ipycloud
from torch.utils.data import DataLoader, TensorDataset

class BlocksInStep5(torch.nn.Linear):
    calls = 0
    def forward(self, inputs):
        BlocksInStep5.calls += 1
        if BlocksInStep5.calls == 5:
            print("blocked", flush=True)
            while True:  # a step that never ends, until interrupted
                time.sleep(0.01)
        return super().forward(inputs)

data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
model = BlocksInStep5(4, 2)
ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
             DataLoader(data, batch_size=8), epochs=1, device="cpu", progress=False,
             checkpoint=sys.argv[1], checkpoint_every_steps=3)
"""


def test_two_interrupts_50_ms_apart_leave_a_record_that_names_the_newest_checkpoint(
        tmp_path: Path) -> None:
    folder = tmp_path / "run"
    (tmp_path / "train.py").write_text(SCRIPT)
    process = subprocess.Popen([sys.executable, "train.py", str(folder)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    said = []
    while (line := process.stdout.readline()) and line != "blocked\n":
        said.append(line)
    assert line, process.communicate()
    os.kill(process.pid, signal.SIGINT)
    time.sleep(0.05)
    os.kill(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == -signal.SIGINT, err

    saved = sorted(int(path.stem.split("-")[1]) for path in folder.glob("step-*.json"))
    assert saved == [3]  # step 4 finished, and was not saved
    [run] = runs(folder)
    line = ("ipycloud.fit: interrupted at step 4 and stopped at once, without saving it; "
            "the newest checkpoint is step 3: rerunning continues from it")
    assert (run.status, run.step, run.reason) == ("failed", 4, f"KeyboardInterrupt: {line}")
    assert [checkpoint["step"] for checkpoint in run.checkpoints] == [3]
    assert out.splitlines()[-1] == line
