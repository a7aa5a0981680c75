"""Cells that end without a traceback on a real IPython shell: a magic's failure as one
line of its own kind, and exceptions whose handler was set before ipycloud loaded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from ipycloud.magics._errors import DownloadFailed
from ipycloud.runtime.train.interrupt import FitInterrupted


@pytest.fixture
def bare_shell() -> Iterator[InteractiveShell]:
    """A fresh real IPython shell without ipycloud loaded yet."""
    InteractiveShell.clear_instance()
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.UsageRecording.enabled = False
    yield InteractiveShell.instance(config=config)
    InteractiveShell.clear_instance()


def shown(text: str) -> list[str]:
    """The lines of ``text`` without colours and blank lines."""
    return [line for line in re.sub(r"\x1b\[[\d;]*m", "", text).splitlines() if line.strip()]


def test_a_failure_shows_its_one_line_and_an_interrupted_fit_nothing_more(
        bare_shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    bare_shell.run_line_magic("load_ext", "ipycloud")
    bare_shell.user_ns.update(DownloadFailed=DownloadFailed, FitInterrupted=FitInterrupted)
    failed = bare_shell.run_cell("raise DownloadFailed('%mount_storage download: it broke')")
    assert isinstance(failed.error_in_exec, DownloadFailed)
    assert shown(capsys.readouterr().out) == ["DownloadFailed: %mount_storage download: "
                                              "it broke"]
    paused = bare_shell.run_cell("print('ipycloud.fit: interrupted at step 3')\n"
                                 "raise FitInterrupted('ipycloud.fit: interrupted at step 3')")
    assert isinstance(paused.error_in_exec, FitInterrupted)  # the cell failed: Run All stops
    assert shown(capsys.readouterr().out) == ["ipycloud.fit: interrupted at step 3"]


def test_a_handler_set_before_loading_keeps_its_exceptions(
        bare_shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    handled: list[Any] = []

    def handler(shell: InteractiveShell, kind: type, error: BaseException, traceback: Any,
                tb_offset: int | None = None) -> None:
        handled.append(error)

    bare_shell.set_custom_exc((LookupError,), handler)
    bare_shell.run_line_magic("load_ext", "ipycloud")
    bare_shell.run_cell("raise KeyError('mine')")
    assert [str(error) for error in handled] == ["'mine'"]
    bare_shell.user_ns["DownloadFailed"] = DownloadFailed
    bare_shell.run_cell("raise DownloadFailed('ours')")
    assert shown(capsys.readouterr().out) == ["DownloadFailed: ours"]
    assert len(handled) == 1
