"""One run of ``fit`` on the XLA device, in a process of its own, as a restarted kernel does.

    python xla_training.py CHECKPOINTS STEPS OUT

It trains the tests' model (with dropout) for STEPS optimizer steps, checkpointing every 10
into CHECKPOINTS and resuming from there if it holds a checkpoint, and saves the final
weights (on the CPU) to OUT.
"""

from __future__ import annotations

import sys

import torch
from test_fit_xla import cpu_state, data, model_and_optimizer

from ipycloud.runtime.train.loop import fit

if __name__ == "__main__":
    folder, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    model, optimizer = model_and_optimizer()
    fit(model, optimizer, data(), max_steps=steps, checkpoint=folder, checkpoint_every_steps=10,
        progress=False)
    torch.save(cpu_state(model), out)
