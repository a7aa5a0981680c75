"""ipycloud: make cloud notebooks a dependable place to train deep-learning models.

``%load_ext ipycloud`` registers the magics. Importing the package is cheap: the runtime
and every heavy dependency load only when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ipycloud._version import __version__ as __version__

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

# Public names served from the runtime on first access, so ``import ipycloud`` stays light:
# what a notebook user calls, and the errors and warnings a user catches or filters.
# tests/test_public_api.py lists them; the rest is imported from its ``ipycloud.runtime``
# module.
_LAZY_ATTRIBUTES = {
    "environment_report": "ipycloud.runtime.machine.report",
    "detect_platform": "ipycloud.runtime.machine.platform",
    "fit": "ipycloud.runtime.train.loop",
    "FitInterrupted": "ipycloud.runtime.train.interrupt",
    "NonFiniteLossError": "ipycloud.runtime.train.step_runner",
    "loader": "ipycloud.runtime.train.data",
    "Callback": "ipycloud.runtime.train.callback",
    "StopTraining": "ipycloud.runtime.train.callback",
    "EarlyStopping": "ipycloud.runtime.train.early_stopping",
    "CheckpointManager": "ipycloud.runtime.checkpoint",
    "CheckpointError": "ipycloud.runtime.checkpoint",
    "CheckpointWarning": "ipycloud.runtime.checkpoint",
    "runs": "ipycloud.runtime.runs",
    "follow": "ipycloud.notebook.follow_in_cell",
    "launch": "ipycloud.runtime.train.distributed",
    "run_under_torchrun": "ipycloud.runtime.train.distributed",
    "LaunchError": "ipycloud.runtime.train.launch_errors",
    "ExportError": "ipycloud.runtime.cluster.options",
    "mount": "ipycloud.runtime.storage.mount",
    "download": "ipycloud.runtime.storage.download",
    "extract": "ipycloud.runtime.storage.extract",
    "sync": "ipycloud.runtime.storage.sync",
    "StorageError": "ipycloud.runtime.storage.errors",
    "StorageWarning": "ipycloud.runtime.storage.errors",
    "BackgroundSync": "ipycloud.runtime.storage.periodic_sync",
    "kaggle_download": "ipycloud.runtime.storage.kaggle",
    "gdrive_download": "ipycloud.runtime.storage.gdrive",
    "usage_report": "ipycloud.runtime.monitor.usage",
    "live_dashboard": "ipycloud.widgets.dashboard",
    "notify": "ipycloud.runtime.notify",
}

# Public namespaces, modules of this package imported on first access.
_LAZY_SUBMODULES = {"cluster"}

# fit draws its live curves in a notebook however it is imported, and launch can name the
# cell that first initialised CUDA: the notebook front attaches itself to the runtime as the
# package loads (the runtime never imports it).
importlib.import_module("ipycloud.notebook").attach()

__all__ = sorted(["__version__", "load_ipython_extension", *_LAZY_ATTRIBUTES, *_LAZY_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"ipycloud.{name}")
    module = _LAZY_ATTRIBUTES.get(name)
    if module is None:
        raise AttributeError(f"module 'ipycloud' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    """The public names and the module's own dunders, for ``dir()``, completion and ``help()``."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Register ipycloud's magics: ``%load_ext ipycloud``."""
    from ipycloud.magics import register_all

    register_all(ipython)
