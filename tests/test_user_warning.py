"""ipycloud's warnings name the user's line, whichever way inside ipycloud they are raised:
a reader called directly or through the index of runs, a checkpoint load, a magic run under
IPython's own frames."""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from ipycloud.runtime.checkpoint import CheckpointManager, CheckpointWarning
from ipycloud.runtime.runs import RunRecordWarning, read_run
from ipycloud.runtime.runs.records import read_records

DAMAGED_LOG = (b'{"t": 1700000000, "kind": "start", "step": 0, "epoch": 0}\n'
               b"not a record\n")


def next_line() -> int:
    """The number of the line after the caller's."""
    return sys._getframe(1).f_lineno + 1


def place(warned: pytest.WarningsRecorder) -> tuple[str, int]:
    (warning,) = warned.list
    return warning.filename, warning.lineno


def test_a_damaged_log_line_is_told_at_the_line_that_read_it(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_bytes(DAMAGED_LOG)

    with pytest.warns(RunRecordWarning, match="line 2 is not a record") as warned:
        line = next_line()
        read_records(log)
    assert place(warned) == (__file__, line)

    with pytest.warns(RunRecordWarning, match="line 2 is not a record") as warned:
        line = next_line()
        read_run(log)  # a summary, through the cached reader of the log
    assert place(warned) == (__file__, line)


def test_a_damaged_checkpoint_is_told_at_the_line_that_loads(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep_last=None)
    for step in (1, 2):
        manager.save({"weight": torch.zeros(2)}, step)
    manager.list()[-1].data_path.write_bytes(b"not a checkpoint")

    with pytest.warns(CheckpointWarning, match="damaged") as warned:
        line = next_line()
        manager.load({"weight": torch.ones(2)})
    assert place(warned) == (__file__, line)


def test_a_magics_warning_is_told_at_the_cell_not_inside_ipython(
        shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINDER_REPO_URL", "https://github.com/example/repo")
    monkeypatch.setenv("HOME", str(tmp_path))

    with (pytest.warns(CheckpointWarning, match="nothing survives a Binder session") as warned,
          contextlib.suppress(UsageError)):  # no checkpoint folder yet: said after the warning
        line = next_line()
        shell.run_line_magic("checkpoint", "list")
    assert place(warned) == (__file__, line)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shell.run_cell("x = 1\n%checkpoint list")
    (told,) = [warning for warning in caught if warning.category is CheckpointWarning]
    assert told.filename.startswith("<ipython-input-") and told.lineno == 2
