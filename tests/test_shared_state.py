"""State every front shares lives in the runtime, once per process, and resets in one call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from ipycloud.runtime.checkpoint import manager_for
from ipycloud.runtime.guard.activity import CALLBACK
from ipycloud.runtime.guard.guard import GuardSettings, session_guard
from ipycloud.runtime.monitor.sampler import shared_sampler
from ipycloud.runtime.per_process import reset_process_state
from ipycloud.runtime.storage.periodic_sync import BackgroundSync, running_syncs


def test_keepalive_status_shows_a_guard_started_from_python(
        shell: InteractiveShell, local_home: Path) -> None:
    session_guard().start(GuardSettings(interval_s=60, limit_s=3600))
    status = str(shell.run_line_magic("keepalive", "status"))
    assert status.startswith("keepalive: running, a ping every 1 min")
    assert str(shell.run_line_magic("keepalive", "stop")).startswith("keepalive stopped")
    assert not session_guard().running


def test_the_guard_speaks_python_and_the_magic_speaks_options(
        shell: InteractiveShell, local_home: Path) -> None:
    python_words = str(session_guard().status())
    assert "start it with ipycloud.runtime.guard.guard.session_guard().start()" in python_words
    assert "give one with GuardSettings(limit_s=...)" in python_words
    assert "%keepalive" not in python_words and "--limit" not in python_words
    magic_words = str(shell.run_line_magic("keepalive", "status"))
    assert "start it with %keepalive start" in magic_words
    assert "no limit known for Local machine; give one with --limit" in magic_words


def test_on_colab_the_magic_displays_the_browser_ping(
        shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch,
        colab_callbacks: dict[str, Callable[..., Any]]) -> None:
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    shown: list[dict[str, Any]] = []
    monkeypatch.setattr(shell.display_pub, "publish",
                        lambda data, **kwargs: shown.append(data))
    shell.run_line_magic("keepalive", "start --interval 60")
    scripts = [data["application/javascript"] for data in shown
               if "application/javascript" in data]
    assert len(scripts) == 1 and scripts[0] == session_guard().browser_script
    assert CALLBACK in scripts[0] and CALLBACK in colab_callbacks


def test_the_checkpoint_magic_and_python_share_one_writer_per_folder(
        shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shell.run_cell("import torch\nmodel = torch.nn.Linear(2, 1)\n")
    monkeypatch.chdir(tmp_path)
    shell.run_line_magic("checkpoint", "save model --step 7 --async --dir shared")
    manager = manager_for(tmp_path / "shared")
    assert manager is manager_for("shared")  # one manager, however the folder is named
    written = manager.wait()  # the magic's save in flight, waited for through Python's manager
    assert written is not None and written.step == 7
    assert manager_for("shared", keep_last=5).keep_last == 5  # the latest keep_last applies


def test_reset_stops_and_forgets_every_shared_object(tmp_path: Path) -> None:
    sampler = shared_sampler()
    sampler.subscribe(lambda sample: None, interval=3600)
    session_guard().start(GuardSettings(interval_s=60))
    (tmp_path / "src").mkdir()
    BackgroundSync(tmp_path / "src", tmp_path / "dst", every_s=3600).start()
    assert sampler.running and session_guard().running and len(running_syncs()) == 1
    guard = session_guard()
    reset_process_state()
    assert not sampler.running and not guard.running and running_syncs() == []
    assert shared_sampler() is not sampler and session_guard() is not guard
