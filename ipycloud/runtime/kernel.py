"""The Jupyter kernel this process runs, if any: found among the modules already loaded,
never imported (the runtime stays neutral about its front)."""

from __future__ import annotations

import sys
from typing import Any


def running_kernel() -> Any | None:
    """The ipykernel kernel of this process, or None outside a Jupyter kernel."""
    kernelbase = sys.modules.get("ipykernel.kernelbase")
    if kernelbase is None:
        return None
    kernel_class = kernelbase.Kernel
    return kernel_class.instance() if kernel_class.initialized() else None
