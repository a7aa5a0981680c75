"""The tutorials (notebooks/*.ipynb): what a run of each must print, and the checks of an
executed tutorial, shared by the suite's run (test_tutorials.py) and the Binder
environment's (test_binder.py)."""

from __future__ import annotations

from pathlib import Path

import nbformat
from kernels import outputs

import ipycloud

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

# What each tutorial must print, so a notebook that runs but shows nothing useful fails.
EXPECTED_OUTPUT = {
    "01-quickstart.ipynb": ["persistent folder:", "RAM this kernel may use"],
    "02-checkpoints.ipynb": ["weights equal to step 50: True", "every weight equals it: True",
                             "resume at step 5 from batch 25", "auto checkpoint of model"],
    "03-training.ipynb": ["ipycloud.fit: starting on cpu", "resuming from step-000000040 ",
                          "resumed run equals the uninterrupted one: True",
                          "best: step ", "both processes hold the same weights: True"],
    "04-storage.ipynb": ["project folder storage-demo/tutorial (local, kept after the session)",
                         "['dataset/test.csv', 'dataset/train.csv']",
                         "is already present and valid", "1 copied, 0 updated, 0 deleted",
                         "free space there:", "background sync: '",
                         "' every 10 min, running, "],
    "05-monitoring.ipynb": ["resources at", "(the live panel stopped)", "final loss",
                            "samples so far", "this process's resident memory (RSS)",
                            "GPU-hours", "'instance': 'aws:g4dn.xlarge'",
                            "deadline actions", "2 checkpoints in guarded-checkpoints",
                            "usage recording goes on once a second"],
    "06-jupyterlab.ipynb": ["enabled OK (python, ipycloud)", "ipycloud.server enabled",
                            "refreshInterval (default 2, 1 to 60)",
                            "No Jupyter server runs this kernel", "platform: Local machine",
                            "06-jupyterlab.ipynb: busy, 1 process, RAM ",
                            "the kernel of train.ipynb was killed by signal 9 (SIGKILL)"],
    "07-colab-workflow.ipynb": ["colab-workflow (local, kept after the session)",
                                "extracted 1 file into ", "2048 rows: 28 training batches",
                                "ipycloud.fit: interrupted at step 50; rerun this cell",
                                "step-000000050 (latest)",
                                "resuming from step-000000050 (step 50, epoch 1, batch 22)",
                                "History: 3 epochs, 84 steps", "colab:T4 (as given)",
                                "Colab compute units/hour"],
}


def code_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def problems(name: str, notebook: nbformat.NotebookNode) -> list[str]:
    """What is wrong with an executed tutorial: the errors its cells raised, and the expected
    lines it did not print (its install cell's version line first)."""
    errors = [f"{name}: {output.ename}: {output.evalue}"
              for cell in code_cells(notebook) for output in cell.outputs
              if output.output_type == "error"]
    text = "\n".join(str(outputs(cell)) for cell in code_cells(notebook))
    expected = [f"ipycloud {ipycloud.__version__}", *EXPECTED_OUTPUT[name]]
    return errors + [f"{name} did not print {line!r}" for line in expected if line not in text]
