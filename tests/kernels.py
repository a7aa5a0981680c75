"""Run notebooks in a real Jupyter kernel (nbclient) and read what their cells produced."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(notebook: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    NotebookClient(notebook, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook


def outputs(cell: nbformat.NotebookNode) -> dict[str, object]:
    """All MIME bundles a cell produced, merged."""
    merged: dict[str, object] = {}
    for output in cell.outputs:
        merged.update(output.get("data", {}))
        if output.output_type == "stream":
            merged[output.name] = merged.get(output.name, "") + output.text
    return merged
