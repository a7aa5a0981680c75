"""A notebook saved with the dashboard page in it keeps a readable snapshot: beside the
live page's iframe, which stays hidden until the page says it is live (and which JupyterLab
removes from an untrusted notebook), and in its place once ``%dashboard stop`` ended it; the
snapshot lists the kernel's run. (tests/test_dashboard_snapshots_browser.py opens such
notebooks in JupyterLab.)"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from kernels import execute

TESTS = Path(__file__).parent
SNAPSHOT = re.compile(r'<div class="ipycloud-snapshot"><p><b>ipycloud dashboard at [\d :-]+ '
                      r"\((?P<note>[^)]+)\)</b></p>(?P<body>.*)</div>", re.DOTALL)


def dashboard_notebook(state: Path, stop: bool) -> nbformat.NotebookNode:
    """A notebook whose kernel has a run (its log as fit writes it) and shows the page."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        f"import os, sys\nos.environ['IPYCLOUD_STATE_DIR'] = {str(state)!r}\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from pathlib import Path\nfrom test_page_runs import MINE, write_run\n"
        "write_run(Path(os.environ['IPYCLOUD_STATE_DIR']), MINE, os.getpid())\n"
        "%load_ext ipycloud",
        "%dashboard --web",
        *(["%dashboard stop"] if stop else []),
    )]
    return notebook


def test_the_live_output_holds_the_iframe_and_a_snapshot(tmp_path: Path) -> None:
    cells = execute(dashboard_notebook(tmp_path / "state", stop=False), tmp_path).cells
    (shown,) = cells[1].outputs
    html = shown.data["text/html"]
    iframe = re.match(r'<div><iframe src="http://127\.0\.0\.1:\d+/\?token=[^"]+" [^>]* hidden '
                      r'onload="(?P<onload>[^"]+)"></iframe><div class="ipycloud-snapshot">',
                      html)
    assert iframe, html  # hidden until the page says it is live, then the snapshot is
    assert "frame.hidden = false; still.hidden = true;" in iframe["onload"]
    snapshot = SNAPSHOT.search(html)
    assert snapshot and snapshot["note"] == "shown where the live page is not"
    assert "a1b2c3d4e5f6" in snapshot["body"] and "4/100" in snapshot["body"]


def test_stopping_the_page_leaves_only_the_snapshot(tmp_path: Path) -> None:
    notebook = execute(dashboard_notebook(tmp_path / "state", stop=True), tmp_path)
    nbformat.write(notebook, tmp_path / "saved.ipynb")
    saved = nbformat.read(tmp_path / "saved.ipynb", as_version=4)
    (shown,) = saved.cells[1].outputs
    html = shown.data["text/html"]
    assert "<iframe" not in html
    snapshot = SNAPSHOT.fullmatch(html)
    assert snapshot and snapshot["note"] == "the live page ended"
    assert "1 run in this kernel" in snapshot["body"]
    assert re.search(r"<td>a1b2c3d4e5f6</td><td>running</td><td>train\.ipynb</td><td>4/100</td>",
                     snapshot["body"])
    assert "<td>CPU</td>" in snapshot["body"]
    text = shown.data["text/plain"]
    assert text.startswith("ipycloud dashboard at ") and "a1b2c3d4e5f6  running" in text
