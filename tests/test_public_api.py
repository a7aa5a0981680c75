"""The public API of ipycloud, listed name by name: a change to it is deliberate, and made here.

The top level holds what a notebook user calls or catches; everything else stays importable
from its module under ``ipycloud.runtime``.
"""

from __future__ import annotations

import importlib
import pydoc
import re

import ipycloud
import ipycloud.cluster

PUBLIC = [
    "BackgroundSync",
    "Callback",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointWarning",
    "EarlyStopping",
    "ExportError",
    "FitInterrupted",
    "LaunchError",
    "NonFiniteLossError",
    "StopTraining",
    "StorageError",
    "StorageWarning",
    "__version__",
    "cluster",
    "detect_platform",
    "download",
    "environment_report",
    "extract",
    "fit",
    "follow",
    "gdrive_download",
    "kaggle_download",
    "launch",
    "live_dashboard",
    "load_ipython_extension",
    "loader",
    "mount",
    "notify",
    "run_under_torchrun",
    "runs",
    "sync",
    "usage_report",
]

CLUSTER = ["ClusterWarning", "ExportError", "ExportedTask", "checkpoint_dir", "export"]

# The exceptions and warnings at the top level are the very classes the runtime raises.
RAISED_IN = {
    "CheckpointError": "ipycloud.runtime.checkpoint.errors",
    "CheckpointWarning": "ipycloud.runtime.checkpoint.errors",
    "FitInterrupted": "ipycloud.runtime.train.interrupt",
    "ExportError": "ipycloud.runtime.cluster.options",
    "LaunchError": "ipycloud.runtime.train.launch_errors",
    "NonFiniteLossError": "ipycloud.runtime.train.step_runner",
    "StopTraining": "ipycloud.runtime.train.callback",
    "StorageError": "ipycloud.runtime.storage.errors",
    "StorageWarning": "ipycloud.runtime.storage.errors",
}

# Names that left the top level, and the module each is imported from now.
MOVED_TO = {
    "History": "ipycloud.runtime.train.history",
    "shared_sampler": "ipycloud.runtime.monitor.sampler",
    "start_monitoring": "ipycloud.runtime.monitor.session",
    "stop_monitoring": "ipycloud.runtime.monitor.session",
    "SessionGuard": "ipycloud.runtime.guard.guard",
    "session_guard": "ipycloud.runtime.guard.guard",
    "GuardSettings": "ipycloud.runtime.guard.settings",
    "register_action": "ipycloud.runtime.guard.deadline",
    "unregister_action": "ipycloud.runtime.guard.deadline",
}


def test_the_public_names_are_exactly_these() -> None:
    assert ipycloud.__all__ == PUBLIC
    assert ipycloud.cluster.__all__ == CLUSTER


def test_every_public_name_resolves() -> None:
    for name in PUBLIC:
        assert getattr(ipycloud, name) is not None, name
    for name in CLUSTER:
        assert getattr(ipycloud.cluster, name) is not None, name
    assert ipycloud.cluster is importlib.import_module("ipycloud.cluster")


def test_the_errors_are_the_ones_the_runtime_raises() -> None:
    for name, module in RAISED_IN.items():
        error = getattr(ipycloud, name)
        assert error is getattr(importlib.import_module(module), name), name
        assert issubclass(error, (BaseException, Warning)), name


def test_the_names_that_left_stay_importable_from_their_modules() -> None:
    for name, module in MOVED_TO.items():
        assert name not in dir(ipycloud), name
        assert not hasattr(ipycloud, name), name
        assert getattr(importlib.import_module(module), name).__name__ == name


def test_dir_lists_the_public_names_and_no_helpers() -> None:
    listed = [name for name in dir(ipycloud) if not name.startswith("__")]
    assert listed == [name for name in PUBLIC if not name.startswith("__")]
    assert "__version__" in dir(ipycloud)


def test_help_documents_every_public_name() -> None:
    text = pydoc.render_doc(ipycloud, renderer=pydoc.plaintext)
    assert f"VERSION\n    {ipycloud.__version__}\n" in text
    for name in PUBLIC:
        if name != "__version__":
            # A class or a function at the start of its entry; a submodule under PACKAGE
            # CONTENTS.
            assert re.search(rf"^ +(class )?{name}\b", text, re.MULTILINE), name
