"""Long-lived objects say in words what they are doing, not ``<... at 0x...>``."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from waiting import wait_for

from ipycloud.runtime.guard.deadline import register_action, unregister_action
from ipycloud.runtime.guard.guard import GuardSettings, SessionGuard
from ipycloud.runtime.storage.periodic_sync import BackgroundSync


def clock(unix_time: float) -> str:
    return time.strftime("%H:%M", time.localtime(unix_time))


def test_a_stopped_guard_says_so_and_what_it_knows(local_home: Path) -> None:
    guard = SessionGuard(started_at=time.time() - 60)
    assert repr(guard) == ("SessionGuard(stopped; no limit known for Local machine; deadline "
                           "actions: none)")
    register_action("flush logs", lambda: None)
    try:
        assert repr(guard).endswith("; deadline actions: flush logs)")
    finally:
        unregister_action("flush logs")


def test_a_running_guard_names_its_pings_limit_warning_and_actions(local_home: Path) -> None:
    started = time.time() - 60
    guard = SessionGuard(started_at=started)
    guard.start(GuardSettings(interval_s=30, limit_s=7200, warnings_s=(900,)))
    try:
        text = repr(guard)
    finally:
        guard.stop()
    assert text.startswith("SessionGuard(running, a ping every 30 s; limit 2 h (as given), ")
    assert re.search(rf"reached at (\S+ )?{clock(started + 7200)}; ", text), text
    assert re.search(rf"next warning at (\S+ )?{clock(started + 6300)}; ", text), text
    assert text.endswith("; deadline actions: none; SIGTERM guarded)")
    assert "0x" not in text


def test_a_background_sync_names_its_folders_pace_and_last_run(tmp_path: Path) -> None:
    source, target = tmp_path / "my data", tmp_path / "kept"
    source.mkdir()
    (source / "a.txt").write_text("a")
    background = BackgroundSync(source, target, every_s=300)
    assert repr(background) == (f"BackgroundSync({str(source)!r} -> {str(target)!r} every "
                                "5 min, stopped, no run yet)")
    background.start()
    try:
        text = wait_for(lambda: "last run" in str(background) and str(background))
    finally:
        background.stop(final=False)
    assert re.fullmatch(rf"{re.escape(repr(str(source)))} -> {re.escape(repr(str(target)))} "
                        r"every 5 min, running, last run at \d\d:\d\d:\d\d ok: 1 copied, "
                        r"0 updated, 0 deleted, 0 unchanged \(1 B\)", text), text
    assert repr(background) == f"BackgroundSync({background})"


def test_a_failed_background_run_is_named_with_its_error(tmp_path: Path) -> None:
    source, blocker = tmp_path / "src", tmp_path / "blocker"
    source.mkdir()
    blocker.write_text("a file, not a folder")
    background = BackgroundSync(source, blocker / "dst", every_s=3600).start()
    wait_for(lambda: background.last_error is not None)
    with pytest.raises(OSError):
        background.stop(final=False)
    assert re.search(r", stopped, last run at \d\d:\d\d:\d\d failed: (FileExistsError|"
                     r"NotADirectoryError): ", str(background)), str(background)
