"""The XLA lane runs on torch_xla's CPU device, in the venv that scripts/test_xla.sh builds."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to start without PJRT_DEVICE=CPU: torch_xla would otherwise look for a TPU."""
    if os.environ.get("PJRT_DEVICE") != "CPU":
        raise pytest.UsageError("run the XLA tests with bash scripts/test_xla.sh "
                                "(it sets PJRT_DEVICE=CPU)")
