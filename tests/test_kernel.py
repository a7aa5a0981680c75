"""ipycloud in a real Jupyter kernel, driven by nbclient, and the tutorial notebooks."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from kernels import execute, outputs

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def notebook_of(*sources: str) -> nbformat.NotebookNode:
    """A notebook of code cells; a cell starting with ``# raises`` may raise."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    for cell in notebook.cells:
        if cell.source.startswith("# raises"):
            cell.metadata["tags"] = ["raises-exception"]
    return notebook


def test_gpuinfo_in_a_kernel(tmp_path: Path) -> None:
    notebook = notebook_of(
        "%load_ext ipycloud",
        # pynvml is left out: the usage sampler's thread imports it for its first reading
        "import sys; print(sorted({'torch', 'ipywidgets'} & set(sys.modules)))",
        "%gpuinfo",
        "%gpuinfo --json",
        "# raises\n%gpuinfo --bogus",
        "print('torch' in sys.modules)",
    )
    cells = execute(notebook, tmp_path).cells
    assert outputs(cells[1])["stdout"].strip() == "[]"
    assert outputs(cells[5])["stdout"].strip() == "False"  # torch is read, not imported
    report = outputs(cells[2])
    assert "<table" in report["text/html"] and "No NVIDIA GPU" in report["text/html"]
    assert report["text/plain"].startswith("Platform")
    data = outputs(cells[3])["application/json"]
    assert data["gpus"]["devices"] == [] and data["disks"][0]["path"] == str(tmp_path)
    assert json.loads(outputs(cells[3])["text/plain"]) == data
    (error,) = cells[4].outputs  # one line on stderr, no traceback
    assert error.output_type == "stream" and error.name == "stderr"
    assert error.text == ("UsageError: %gpuinfo: unrecognized arguments: --bogus "
                          "(see %gpuinfo? for usage)\n")


WAIT_FOR_TWO_SAMPLES = """import time
from ipycloud.runtime.monitor.usage import shared_tracker
deadline = time.monotonic() + 60
while shared_tracker().samples < 2 and time.monotonic() < deadline:
    time.sleep(0.05)"""


def test_usage_is_recorded_from_load_ext_on(tmp_path: Path) -> None:
    notebook = notebook_of(
        "%load_ext ipycloud",
        WAIT_FOR_TWO_SAMPLES,
        "import ipycloud\nreport = ipycloud.usage_report()\n"
        "print(report.samples >= 2, report.duration_s >= 1)",
        "%dashboard report",
    )
    cells = execute(notebook, tmp_path).cells
    assert outputs(cells[2])["stdout"].strip() == "True True"
    assert "GPU-hours" in str(outputs(cells[3])["text/plain"])


def test_usage_recording_turned_off_in_the_kernel_config(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text("c.UsageRecording.enabled = False\n")
    monkeypatch.setenv("IPYTHONDIR", str(profile.parent))
    notebook = notebook_of(
        "%load_ext ipycloud",
        "import threading, time\ntime.sleep(1.5)  # more than a sampler's interval\n"
        "print([thread.name for thread in threading.enumerate()\n"
        "       if thread.name.startswith('ipycloud')])",
        "# raises\n%dashboard report",
    )
    cells = execute(notebook, tmp_path).cells
    assert outputs(cells[1])["stdout"].strip() == "[]"
    (error,) = cells[2].outputs
    assert error.text.startswith("UsageError: %dashboard report: no samples recorded yet")


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
    "05-monitoring.ipynb": ["resources at", "<Dashboard live, every 0.5 s", "final loss",
                            "samples so far", "this process's resident memory (RSS)",
                            "GPU-hours", "'instance': 'aws:g4dn.xlarge'",
                            "deadline actions", "2 checkpoint(s) in guarded-checkpoints",
                            "usage recording goes on once a second"],
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_tutorial_notebook_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    notebook = execute(nbformat.read(path, as_version=4), tmp_path)
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    assert errors == []
    text = "\n".join(str(outputs(cell)) for cell in notebook.cells if cell.cell_type == "code")
    for expected in EXPECTED_OUTPUT[path.name]:
        assert expected in text


def test_every_tutorial_is_checked() -> None:
    assert [path.name for path in NOTEBOOKS] == sorted(EXPECTED_OUTPUT)
