"""Run the tutorials from a clean kernel each and save them with their outputs, so that GitHub,
Colab and Binder show what a run looks like.

    .venv/bin/python scripts/run_notebooks.py                 # every notebooks/*.ipynb, in place
    .venv/bin/python scripts/run_notebooks.py notebooks/07-colab-workflow.ipynb
    python scripts/run_notebooks.py --into DIR                # executed copies into DIR

Each notebook runs top to bottom in a new kernel of this Python (the ``python3`` kernel), in
a scratch folder of its own under the temporary folder, emptied first: what a tutorial writes
stays out of the checkout, and the paths it prints are the same from one run to the next.
Execution timings and widget state are not saved, so a rerun changes only what the cells
printed. A notebook with a failing cell is not saved; the script names it and exits with 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT_S = 300


def scratch_folder(notebook: Path) -> Path:
    """The notebook's working folder, emptied: ``<tmp>/ipycloud-notebooks/<name>``."""
    folder = Path(tempfile.gettempdir()) / "ipycloud-notebooks" / notebook.stem
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def execute(notebook: Path) -> nbformat.NotebookNode:
    """The notebook run from a clean kernel; raises CellExecutionError for a failing cell."""
    node = nbformat.read(notebook, as_version=4)
    for cell in node.cells:  # nothing of an earlier run survives a failure halfway
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    NotebookClient(node, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                   store_widget_state=False,
                   resources={"metadata": {"path": str(scratch_folder(notebook))}}).execute()
    node.metadata.pop("widgets", None)
    return node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: every notebooks/*.ipynb)")
    parser.add_argument("--into", type=Path,
                        help="write the executed notebooks into this folder instead of in place")
    args = parser.parse_args(argv)
    failed = []
    for notebook in args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb")):
        started = time.monotonic()
        try:
            executed = execute(notebook)
        except CellExecutionError as error:
            failed.append(notebook.name)
            print(f"{notebook.name}: failed, not saved\n{error}", file=sys.stderr)
            continue
        target = notebook if args.into is None else args.into / notebook.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(executed, target)
        print(f"{notebook.name}: {time.monotonic() - started:.1f} s, saved to {target}",
              flush=True)
    if failed:
        print(f"failing: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
