"""The tutorials (notebooks/): each runs in a real kernel from a clean state, top to bottom,
and prints what it should. The copies in the repository open anywhere (Colab and Binder
badges, the same install cell first) and carry the outputs of one clean run
(scripts/run_notebooks.py)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from jupyter_process import JupyterProcess
from kernels import execute, run, session_kernel
from tutorials import EXPECTED_OUTPUT, NOTEBOOKS, code_cells, problems

COLAB = "https://colab.research.google.com/github/ipycloud/ipycloud/blob/main/notebooks/"
BINDER = "https://mybinder.org/v2/gh/ipycloud/ipycloud/main?urlpath=lab/tree/notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_tutorial_runs_top_to_bottom(path: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # What a tutorial keeps in the home folder (the local persistent storage) stays in the test's.
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    notebook = execute(nbformat.read(path, as_version=4), work)
    assert problems(path.name, notebook) == []


def test_every_tutorial_is_checked() -> None:
    assert [path.name for path in NOTEBOOKS] == sorted(EXPECTED_OUTPUT)


def test_each_tutorial_opens_with_its_badges_and_the_one_install_cell() -> None:
    notebooks = {path.name: nbformat.read(path, as_version=4) for path in NOTEBOOKS}
    for name, notebook in notebooks.items():
        first = notebook.cells[0]
        assert first.cell_type == "markdown" and first.source.startswith("# "), name
        assert f"]({COLAB}{name})" in first.source, name
        assert f"]({BINDER}{name})" in first.source, name
    install_cells = {code_cells(notebook)[0].source for notebook in notebooks.values()}
    assert len(install_cells) == 1, "the tutorials' first code cells differ"
    assert "import ipycloud" in install_cells.pop()


def test_each_tutorial_keeps_the_outputs_of_one_clean_run() -> None:
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        cells = code_cells(notebook)
        # Counted 1, 2, 3, ... down the notebook: one run from a fresh kernel, top to bottom.
        assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1)), \
            f"{path.name}: rerun scripts/run_notebooks.py"
        assert cells[0].outputs, f"{path.name} has no saved outputs"
        assert not [output for cell in cells for output in cell.outputs
                    if output.output_type == "error"], path.name
        # Nothing that changes from one run to the next without the outputs changing.
        assert not [cell for cell in cells if "execution" in cell.metadata], path.name
        assert "widgets" not in notebook.metadata, path.name


def test_the_jupyterlab_tutorial_reads_the_routes_of_the_server_that_runs_it(
        tmp_path: Path) -> None:
    """Where the tutorials run in the suite, no server runs the kernel; on Binder one does.
    Here its cells run in a kernel that a real Jupyter server started for the notebook."""
    (tmp_path / "home").mkdir()
    server = JupyterProcess(tmp_path / "home", tmp_path)
    try:
        server.wait_ready()
        with session_kernel(server, "06-jupyterlab.ipynb") as (_, client):
            notebook = nbformat.read(NOTEBOOKS[0].parent / "06-jupyterlab.ipynb", as_version=4)
            text = "".join(run(client, cell.source) for cell in code_cells(notebook))
    finally:
        server.close()
    assert f"Reading the routes of the Jupyter server at {server.base}/" in text
    # The server learns "busy" from the kernel's messages, which may lag behind the cell.
    assert re.search(r"06-jupyterlab\.ipynb: (busy|idle), 1 process, RAM ", text)
    assert "platform: Local machine" in text
