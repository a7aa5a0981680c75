"""The notebook notes the cell after which CUDA was first initialised (torch's state is
replaced at its boundary: no GPU here), once, and stops looking."""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from ipycloud.notebook.cuda_cell import BEFORE_IMPORT, watch_cuda_start
from ipycloud.runtime.machine import cuda_start


@pytest.fixture(autouse=True)
def nothing_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_start, "_started_where", [])


def test_the_first_cell_after_which_cuda_is_up_is_named(
        shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    hooks = len(shell.events.callbacks["post_run_cell"])
    watch_cuda_start()
    shell.run_cell("data = list(range(3))", store_history=True)
    assert cuda_start.cuda_started_where() is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    shell.run_cell("\nmodel = 'Net().cuda()'\nmore = 1", store_history=True)
    assert cuda_start.cuda_started_where() == "cell In [2] (model = 'Net().cuda()' …)"
    shell.run_cell("x = 2", store_history=True)
    assert cuda_start.cuda_started_where() == "cell In [2] (model = 'Net().cuda()' …)"
    assert len(shell.events.callbacks["post_run_cell"]) == hooks  # it stopped looking


def test_cuda_up_before_ipycloud_was_imported_is_said_so(
        shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    watch_cuda_start()
    assert cuda_start.cuda_started_where() == BEFORE_IMPORT


def test_outside_a_shell_nothing_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    InteractiveShell.clear_instance()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    watch_cuda_start()
    assert cuda_start.cuda_started_where() is None
