"""IPython magics: thin fronts that parse a line, call the runtime and return a rich object."""

from __future__ import annotations

from IPython.core.interactiveshell import InteractiveShell

from ipycloud.magics._errors import show_without_traceback
from ipycloud.magics.checkpoint import CheckpointMagics
from ipycloud.magics.dashboard import DashboardMagics
from ipycloud.magics.gpuinfo import GpuInfoMagics
from ipycloud.magics.keepalive import KeepaliveMagics
from ipycloud.magics.notify import NotifyMagics
from ipycloud.magics.storage import StorageMagics
from ipycloud.magics.usage import UsageRecording

MAGICS = (GpuInfoMagics, CheckpointMagics, StorageMagics, DashboardMagics, KeepaliveMagics,
          NotifyMagics)


def register_all(ipython: InteractiveShell) -> None:
    """Register every ipycloud magics class on ``ipython``, end cells on a failed download
    or an interrupted ``fit`` with one line, and start recording usage (unless
    ``UsageRecording.enabled`` is False). ``import ipycloud`` has already had the notebook
    front draw the live curves of ``fit``."""
    for magics in MAGICS:
        ipython.register_magics(magics)
    show_without_traceback(ipython)
    UsageRecording(ipython)
