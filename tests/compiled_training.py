"""A seeded ``fit(compile=...)`` run in a fresh interpreter, for test_fit_compile.py::

    python tests/compiled_training.py FOLDER OUT [--compile MODE] [--interrupt-at K]
                                      [--model mlp|blocks|counting] [--samples N]
                                      [--fail-compile]

Trains a small model (``mlp``; ``blocks``: three repeated residual blocks; ``counting``: one
that recompiles at every step, under a recompile limit of 2) on N samples
in batches of 4 (the last one partial where N is not a multiple of 4) for two epochs with
validation, checkpointing into FOLDER, and writes the final state, what torch's compiler
counted (graphs compiled, FX-graph cache hits) and whether every module has its own
forward back to OUT as JSON. ``--interrupt-at K`` presses
Ctrl-C after step K (fit saves and raises FitInterrupted; the process exits 3).
``--fail-compile`` points torch's code generator at a C++ compiler that is not there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

from ipycloud.runtime.train.interrupt import FitInterrupted
from ipycloud.runtime.train.loop import fit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from gpu_check import PauseAfter  # the same pause the GPU check makes


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Counting(nn.Module):
    """Scales by how many times it was called: a Python value compile guards on, so each
    step recompiles until torch gives up."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.calls = nn.Linear(6, 3), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x) * self.calls


def model_of(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "counting":
        from torch._dynamo import config

        config.recompile_limit = 2
        return Counting()
    if kind == "blocks":
        return nn.Sequential(nn.Linear(6, 16), nn.Sequential(Block(), Block(), Block()),
                             nn.Linear(16, 3))
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--compile", default="true")
    parser.add_argument("--interrupt-at", type=int, default=None)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--fail-compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.fail_compile:
        from torch._inductor import config

        config.cpp.cxx = (None, "/no/such/g++")
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(args.samples, 6, generator=generator)
    labels = inputs[:, :3].argmax(1)
    batches = [(inputs[i:i + 4], labels[i:i + 4]) for i in range(0, args.samples, 4)]
    model = model_of(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mode = {"true": True, "false": False}.get(args.compile, args.compile)
    try:
        fit(model, optimizer, batches, epochs=2, val_data=batches[:3], compile=mode,
            checkpoint=args.folder, device="cpu", precision="fp32", progress="bar",
            callbacks=[PauseAfter(args.interrupt_at)], seed=4)
    except FitInterrupted:
        sys.exit(3)
    from torch._dynamo.utils import counters

    with open(args.out, "w") as file:
        json.dump({"state": {name: tensor.tolist() for name, tensor
                             in model.state_dict().items()},
                   "graphs": counters["stats"]["unique_graphs"],
                   "own_forwards": all("forward" not in vars(module)
                                       for module in model.modules()),
                   "cache_hits": counters["inductor"]["fxgraph_cache_hit"]}, file)


if __name__ == "__main__":
    main()
