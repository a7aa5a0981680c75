"""launch() from a real kernel after CUDA is up (simulated in the kernel): the ranks start
fresh with the notebook's function, the classes it uses and its arguments carried by value,
and train as forked ranks do; what cannot be carried is refused naming the cell that first
initialised CUDA."""

from __future__ import annotations

import json
from pathlib import Path

from kernels import kernel, run

DEFINITIONS = """\
import json, threading, torch, ipycloud
from torch import nn

class Doubled(nn.Module):  # a class defined in the notebook
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 2)
    def forward(self, x):
        return 2 * self.inner(x)

SEED = 3  # a global the function reads

def train(steps):
    torch.manual_seed(SEED)
    inputs, labels = torch.randn(32, 4), torch.randint(0, 2, (32,))
    model = Doubled()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(inputs[i:i + 4], labels[i:i + 4]) for i in range(0, 32, 4)]
    ipycloud.fit(model, optimizer, batches, max_steps=steps, device="cpu", progress=False,
                 precision="fp32")
    return {"cuda_initialised": torch.cuda.is_initialized(),
            "weights": [round(value, 6) for value in model.inner.weight.flatten().tolist()]}
"""
CUDA_CELL = "torch.cuda.is_initialized = lambda: True  # stands in for model.cuda()"


def test_launch_after_cuda_is_up_in_a_kernel_starts_fresh_ranks_that_train_as_forked_ones(
        tmp_path: Path) -> None:
    with kernel(tmp_path) as (_, client):
        run(client, DEFINITIONS)
        forked = json.loads(run(client, "print(json.dumps(ipycloud.launch(train, 3, "
                                        "nprocs=2)))"))
        run(client, CUDA_CELL)
        fresh = json.loads(run(client, "print(json.dumps(ipycloud.launch(train, 3, "
                                       "nprocs=2)))"))
        refused = run(client, """\
lock = threading.Lock()
def holds_a_lock():
    return lock.locked()
try:
    ipycloud.launch(holds_a_lock, nprocs=2)
except ipycloud.LaunchError as error:
    print(error)
""")
    # A rank forked after the replacement would inherit it; a fresh one has its own torch.
    assert [rank["cuda_initialised"] for rank in fresh] == [False, False]
    assert fresh == forked and fresh[0]["weights"] == fresh[1]["weights"]
    assert refused.startswith("launch starts its ranks fresh (CUDA is initialised in this "
                              "process, first after cell In [3] (torch.cuda.is_initialized "
                              "= lambda"), refused
    assert "and fn and its arguments cannot be sent to them: " in refused
    assert refused.rstrip().endswith("restart the kernel and call launch() before that cell")
