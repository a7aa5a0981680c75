"""A kernel that reruns a ``fit`` cell with ``ipycloud.loader`` holds no more processes than
after the first run, and its shutdown ends every process it started (a spawn context's
resource tracker too: at once, not 30 s later)."""

from __future__ import annotations

import json
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




SPAWN_CELL = """\
import json, os, torch, ipycloud
from torch.utils.data import DataLoader, TensorDataset
from ipycloud.runtime.train.callback import Callback

class SemaphoresSeen(Callback):  # the named semaphores this kernel has mapped while fit runs
    names = set()

    def on_step(self, step, logs):
        with open("/proc/self/maps") as maps:
            SemaphoresSeen.names |= {line.split()[-1] for line in maps if "/dev/shm/sem." in line}

ds = TensorDataset(torch.randn(64, 16), torch.randint(0, 3, (64,)))
m = torch.nn.Linear(16, 3)
ipycloud.fit(m, torch.optim.SGD(m.parameters(), lr=0.1),
             DataLoader(ds, batch_size=16, num_workers=1, persistent_workers=True,
                        multiprocessing_context="spawn"),
             epochs=2, loss_fn=torch.nn.functional.cross_entropy, progress=False,
             callbacks=[SemaphoresSeen()])
print(json.dumps({"seen": len(SemaphoresSeen.names),
                  "left": sorted(name for name in SemaphoresSeen.names if os.path.exists(name))}))
"""


def test_a_spawn_loader_leaves_no_semaphore_and_no_child_that_holds_up_the_shutdown(
        tmp_path: Path) -> None:
    with kernel(tmp_path) as (manager, client):
        process = psutil.Process(int(run(client, "import os; print(os.getpid())")))
        found = json.loads(run(client, SPAWN_CELL).splitlines()[-1])
        # multiprocessing's resource tracker ignores SIGTERM: a kernel's shutdown waited
        # for it through ipykernel's SIGTERM-then-SIGKILL sequence, about 30 s
        children = [" ".join(child.cmdline()) for child in alive(process.children())]
        family = [process, *process.children(recursive=True)]
        manager.request_shutdown()
        wait_for(lambda: not alive(family), timeout=120, what="the kernel ending")
    assert children == []
    assert found["seen"] > 0 and found["left"] == []
