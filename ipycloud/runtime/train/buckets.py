"""DDP's gradient buckets, settled before a resumed run's first step.

DistributedDataParallel reduces gradients in buckets. Its first backward pass uses one
bucket laid out in the parameters' order; after it, DDP rebuilds the buckets in the order
the gradients became ready and keeps that layout. The backend's all-reduce splits each
bucket into chunks, and where a value sits in its bucket decides the order in which the
ranks' values are added. With two ranks that order cannot change a sum; with three or
more it can (float addition does not associate). An uninterrupted run reduces its first
step in the first layout and every later step in the rebuilt one; a run resumed at step
k would reduce step k + 1 in the first layout and differ from it in the last bits.

So a resumed run under three or more ranks makes one forward and backward pass whose
gradients are thrown away: DDP rebuilds its buckets from it, and every step that counts
is reduced in the layout the uninterrupted run used. The pass touches nothing that
lasts: the model's buffers (batch-norm statistics) and the random generators are put
back, and the gradients are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ipycloud.runtime.checkpoint import rng


def rebuilds_buckets(model: Any, world_size: int) -> bool:
    """Whether ``model`` is DDP over three or more ranks that will rebuild its buckets."""
    from torch.nn.parallel import DistributedDataParallel

    if world_size < 3 or not isinstance(model, DistributedDataParallel):
        return False
    return bool(model.static_graph or not model.find_unused_parameters)


def settle_buckets(model: Any, loss: Callable[[], Any]) -> None:
    """One discarded forward and backward pass through ``model`` (``loss()`` computes the
    loss of a batch through it), after which DDP's buckets are laid out for good."""
    import torch

    buffers = [buffer.detach().clone() for buffer in model.buffers()]
    states = rng.capture_rng_states()
    try:
        loss().backward()
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for buffer, saved in zip(model.buffers(), buffers, strict=True):
                buffer.copy_(saved)
        rng.restore_rng_states(states)
