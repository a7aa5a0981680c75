"""Optional dependencies: probe without importing, import with a message naming the extra."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def is_available(module: str) -> bool:
    """Whether ``module`` could be imported, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that says which pip extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{module} is required for this feature: pip install 'ipycloud[{extra}]'"
        ) from error
