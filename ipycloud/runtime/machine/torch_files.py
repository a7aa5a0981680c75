"""What the installed torch is, read from its files without importing it (that takes 1-2 s).

torch's ``version.py``, written when torch is built, states its version and the CUDA
version it was built for. A CUDA build installed by pip loads cuDNN from the
``nvidia/cudnn`` folder of the nvidia-cudnn-cu* distribution on ``sys.path``; the
``cudnn_version.h`` there gives that library's version.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

_CUDNN_DEFINE = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+CUDNN_(MAJOR|MINOR|PATCHLEVEL)[ \t]+(\d+)",
                           re.MULTILINE)


@dataclass(frozen=True)
class TorchBuild:
    """The installed torch's version and CUDA runtime, as its ``version.py`` states them."""

    version: str  # torch.__version__, e.g. "2.5.1+cu121"
    cuda: str | None  # torch.version.cuda, e.g. "12.1"; None for a CPU or ROCm build


def read_torch_build() -> TorchBuild | None:
    """torch's version and CUDA runtime from its ``version.py``, which is read, not run.

    None when torch is not installed or its ``version.py`` does not state both.
    """
    try:
        spec = importlib.util.find_spec("torch")  # finds the package without running it
    except (ImportError, ValueError):
        return None
    folders = spec.submodule_search_locations if spec is not None else None
    for folder in folders or ():
        values = _literal_assignments(Path(folder, "version.py"))
        version, cuda = values.get("__version__"), values.get("cuda")
        if isinstance(version, str) and "cuda" in values and (cuda is None
                                                              or isinstance(cuda, str)):
            return TorchBuild(version, cuda)
    return None


def cudnn_version() -> str | None:
    """The version ("9.1.0") of the cuDNN in the first ``nvidia/cudnn`` folder on
    ``sys.path``, the one a pip-installed CUDA torch loads; None when there is none."""
    for entry in sys.path:
        header = Path(entry or ".", "nvidia", "cudnn", "include", "cudnn_version.h")
        try:
            text = header.read_bytes()
        except OSError:
            continue
        parts = {name: int(number) for name, number in _CUDNN_DEFINE.findall(text)}
        if len(parts) == 3:
            return f"{parts[b'MAJOR']}.{parts[b'MINOR']}.{parts[b'PATCHLEVEL']}"
    return None


def _literal_assignments(path: Path) -> dict[str, object]:
    """The names a Python file assigns a literal at its top level (the file is not run)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return {}
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                values[target.id] = ast.literal_eval(value)
            except (ValueError, TypeError):  # not a literal (a call, a name)
                continue
    return values
