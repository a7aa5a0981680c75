"""ipycloud: make cloud notebooks a dependable place to train deep-learning models.

``%load_ext ipycloud`` registers the magics. Importing the package is cheap: the runtime
and every heavy dependency load only when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ipycloud._version import __version__

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

# Public names served from the runtime on first access, so ``import ipycloud`` stays light.
_LAZY_ATTRIBUTES = {
    "environment_report": "ipycloud.runtime.machine.report",
    "detect_platform": "ipycloud.runtime.machine.platform",
    "CheckpointManager": "ipycloud.runtime.checkpoint",
    "fit": "ipycloud.runtime.train.loop",
    "History": "ipycloud.runtime.train.history",
    "runs": "ipycloud.runtime.runs",
    "follow": "ipycloud.notebook.follow_in_cell",
    "loader": "ipycloud.runtime.train.data",
    "launch": "ipycloud.runtime.train.distributed",
    "run_under_torchrun": "ipycloud.runtime.train.distributed",
    "mount": "ipycloud.runtime.storage.mount",
    "download": "ipycloud.runtime.storage.download",
    "extract": "ipycloud.runtime.storage.extract",
    "sync": "ipycloud.runtime.storage.sync",
    "BackgroundSync": "ipycloud.runtime.storage.periodic_sync",
    "kaggle_download": "ipycloud.runtime.storage.kaggle",
    "gdrive_download": "ipycloud.runtime.storage.gdrive",
    "start_monitoring": "ipycloud.runtime.monitor.session",
    "stop_monitoring": "ipycloud.runtime.monitor.session",
    "shared_sampler": "ipycloud.runtime.monitor.sampler",
    "usage_report": "ipycloud.runtime.monitor.usage",
    "live_dashboard": "ipycloud.widgets.dashboard",
    "SessionGuard": "ipycloud.runtime.guard.guard",
    "session_guard": "ipycloud.runtime.guard.guard",
    "GuardSettings": "ipycloud.runtime.guard.settings",
    "register_action": "ipycloud.runtime.guard.deadline",
    "unregister_action": "ipycloud.runtime.guard.deadline",
    "notify": "ipycloud.runtime.notify",
}

# Public namespaces, modules of this package imported on first access.
_LAZY_SUBMODULES = {"cluster"}

# fit draws its live curves in a notebook however it is imported: the notebook front
# registers itself with the runtime as the package loads (the runtime never imports it).
importlib.import_module("ipycloud.notebook").follow_runs()

__all__ = ["__version__", "load_ipython_extension", *_LAZY_ATTRIBUTES, *_LAZY_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"ipycloud.{name}")
    module = _LAZY_ATTRIBUTES.get(name)
    if module is None:
        raise AttributeError(f"module 'ipycloud' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Register ipycloud's magics: ``%load_ext ipycloud``."""
    from ipycloud.magics import register_all

    register_all(ipython)
