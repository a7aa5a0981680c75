"""torchrun as ipycloud starts it: ``ipycloud torchrun`` is torch's own ``torchrun`` with
each group of workers keeping a TCP store of its own.

By default (torch 2.4 on) the workers reuse the rendezvous store of the agent on the
first machine, under a key prefix that counts the restarts. But each agent counts its own
restarts: the agent whose worker died counts one, the agent that only saw its peer leave
counts none, so after a restart the workers of one group look for each other under two
prefixes and wait in ``init_process_group`` forever (pytorch#135712). With
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` the first rank of every new group starts a
store of its own, and restarts and scale-downs go through.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ipycloud.runtime.user_warning import warn

SEPARATE_STORES = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def torchrun(arguments: Sequence[str]) -> int:
    """Run torchrun with ``arguments`` (its own options, the script and the script's), each
    group of workers with a store of its own unless the caller set
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE; returns its exit status."""
    os.environ.setdefault(SEPARATE_STORES, "1")
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        run.main(list(arguments))
    except ChildFailedError as error:  # which worker failed and how, as torchrun says it
        print(error.format_msg(), file=sys.stderr)
        return 1
    return 0


def warn_if_restarts_can_hang() -> None:
    """Warn (in the first rank) when torchrun may restart this group with the agents'
    shared store, in which a restarted group waits forever."""
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    restarts = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
    if shared and restarts.isdigit() and int(restarts) > 0 and os.environ.get("RANK") == "0":
        warn("torchrun shares its agents' store with these workers, so a group it "
             "restarts can wait forever in init_process_group (pytorch#135712): "
             "start it with 'ipycloud torchrun' instead, or set "
             f"{SEPARATE_STORES}=1", RuntimeWarning)
