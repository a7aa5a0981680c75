"""The XLA lane runs on torch_xla's CPU device, in the venv that scripts/test_xla.sh builds."""

from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to start without PJRT_DEVICE=CPU (torch_xla would otherwise look for a TPU);
    keep the user's state folder out of the tests."""
    if os.environ.get("PJRT_DEVICE") != "CPU":
        raise pytest.UsageError("run the XLA tests with bash scripts/test_xla.sh "
                                "(it sets PJRT_DEVICE=CPU)")
    # The runs these tests train are indexed in a state folder of their own, not the user's.
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="ipycloud-xla-tests-")
    os.environ.pop("IPYCLOUD_STATE_DIR", None)
