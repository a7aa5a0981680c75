"""ipycloud in a real Jupyter kernel, driven by nbclient (the tutorials: test_tutorials.py)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import nbformat
import pytest
from kernels import execute, kernel, outputs, run


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
    assert error.text == ("UsageError: %gpuinfo: unknown option --bogus "
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


def test_a_final_sync_that_fails_at_kernel_exit_reaches_the_server_log_and_the_next_kernel(
        tmp_path: Path) -> None:
    source, target = tmp_path / "my outputs", tmp_path / "it's kept"
    source.mkdir()
    (source / "a.txt").write_text("a")
    pair = f"{shlex.quote(str(source))} {shlex.quote(str(target))}"
    log = tmp_path / "kernel stderr.log"
    with log.open("w") as stderr, kernel(tmp_path, stderr=stderr) as (manager, client):
        run(client, "%load_ext ipycloud")
        run(client, f"%mount_storage sync {pair} --every 1h")
        run(client, "import time\n"
                    "from ipycloud.runtime.storage.periodic_sync import running_syncs\n"
                    "while running_syncs()[0].last_report is None:\n    time.sleep(0.01)")
        shutil.rmtree(target)
        target.write_text("a file where the folder was")
        manager.shutdown_kernel(now=False)  # as a Jupyter server shuts a kernel down
    logged = [line for line in log.read_text().splitlines() if line.startswith("ipycloud:")]
    failure = (f"the final sync of {str(source)!r} -> {str(target)!r} at exit (")
    assert len(logged) == 1 and logged[0].startswith(f"ipycloud: {failure}"), logged
    assert logged[0].endswith(f"failed: NotADirectoryError: [Errno 20] sync destination "
                              f"{str(target)!r} is not a folder; run ipycloud.sync("
                              f"{str(source)!r}, {str(target)!r})")
    with kernel(tmp_path) as (_, client):
        run(client, "%load_ext ipycloud")
        status = run(client, "%mount_storage status")
    assert f"failed final sync: {failure}" in status
    assert status.rstrip().endswith(f"; run %mount_storage sync {pair}")
