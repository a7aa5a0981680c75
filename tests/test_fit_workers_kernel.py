"""A kernel that reruns a ``fit`` cell with ``ipycloud.loader`` holds no more processes than
after the first run, and its shutdown ends every process it started."""

from __future__ import annotations

from pathlib import Path

import psutil
from kernels import kernel, run
from process_helpers import ended
from waiting import wait_for

FIT_CELL = """\
import torch, ipycloud
ds = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 3, (256,)))
m = torch.nn.Linear(16, 3)
ipycloud.fit(m, torch.optim.AdamW(m.parameters()),
             ipycloud.loader(ds, batch_size=16, num_workers=2), epochs=2,
             loss_fn=torch.nn.functional.cross_entropy, progress=False)
"""


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [process for process in processes if not ended(process)]


def test_ten_fit_cells_hold_no_more_processes_than_one_and_shutdown_ends_them_all(
        tmp_path: Path) -> None:
    with kernel(tmp_path) as (manager, client):
        process = psutil.Process(int(run(client, "import os; print(os.getpid())")))
        children = []
        for _ in range(10):
            run(client, FIT_CELL)
            children.append(len(alive(process.children(recursive=True))))
        family = [process, *process.children(recursive=True)]
        manager.request_shutdown()
        wait_for(lambda: not alive(family), timeout=120,
                 what="the kernel and every process it started ending by themselves")
    assert max(children) <= children[0], children
