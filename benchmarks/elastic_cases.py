"""What the elastic benchmarks train under torchrun (the models, their data), and the
environment of the two local torchrun agents that stand in for two nodes.

Imported by the benchmarks (``elastic_restart.py``, ``elastic_throughput.py``) and by the
training scripts they hand to torchrun; it imports torch only inside the functions that
build models and data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import TensorDataset

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NODES, PROCESSES_PER_NODE = 2, 2
WORLD_SIZE = NODES * PROCESSES_PER_NODE
DATA_SEED = 5


@dataclass(frozen=True)
class Case:
    """One model and its data: what every loop of a round trains."""

    name: str
    description: str
    batch: int  # per rank and step

    def model(self, seed: int = 0) -> nn.Module:
        import torch

        torch.manual_seed(seed)
        return _MODELS[self.name]()

    def dataset(self, steps: int) -> TensorDataset:
        """Random inputs and labels of 10 classes, enough for ``steps`` steps of every
        rank; the same in every process."""
        import torch
        from torch.utils.data import TensorDataset

        generator = torch.Generator().manual_seed(DATA_SEED)
        samples = steps * self.batch * WORLD_SIZE
        shape = (3, 32, 32) if self.name == "cnn" else (512,)
        return TensorDataset(torch.randn(samples, *shape, generator=generator),
                             torch.randint(0, 10, (samples,), generator=generator))


def _mlp() -> nn.Module:
    from torch import nn

    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def _cnn() -> nn.Module:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10))


_MODELS = {"mlp": _mlp, "cnn": _cnn}
CASES = {
    "mlp": Case("mlp", "MLP 512-1024-1024-10 (1.6 M parameters, 6.3 MB), batches of 64 a rank",
                64),
    "cnn": Case("cnn", "3 conv layers (16-32-64 channels) on 3x32x32 images, 10 classes, "
                       "batches of 64 a rank", 64),
}


def agents_environment(state: Path) -> dict[str, str]:
    """The environment of the agents and their workers: this checkout's ipycloud first on
    the path, one torch thread a worker, run records indexed under ``state``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "OMP_NUM_THREADS": "1", "IPYCLOUD_STATE_DIR": str(state)}

