"""The session guard in this process: real threads, real signals, a real IPython shell."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from waiting import wait_for

from ipycloud.runtime.checkpoint import CheckpointManager, auto
from ipycloud.runtime.guard import deadline
from ipycloud.runtime.guard.activity import CALLBACK, BrowserActivity
from ipycloud.runtime.guard.guard import (
    GuardSettings,
    SessionGuard,
    register_action,
    unregister_action,
)


def keepalive_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "ipycloud-keepalive"]


@pytest.fixture
def actions() -> Iterator[Callable[[str, Callable[[], object]], None]]:
    """register_action, undone after the test (and no automatic checkpoint left behind)."""
    names: list[str] = []

    def register(name: str, action: Callable[[], object]) -> None:
        register_action(name, action)
        names.append(name)

    yield register
    for name in names:
        unregister_action(name)
    auto.unregister()


@pytest.fixture
def guard() -> Iterator[SessionGuard]:
    """A guard whose clock starts now, stopped (SIGTERM handler restored) after the test."""
    previous = signal.getsignal(signal.SIGTERM)
    session_guard = SessionGuard(started_at=time.time())
    yield session_guard
    session_guard.stop()
    signal.signal(signal.SIGTERM, previous)


# -- deadline ---------------------------------------------------------------------------------


def test_each_warning_point_runs_the_actions_exactly_once(guard: SessionGuard,
                                                          actions: Any) -> None:
    calls: list[float] = []
    actions("record", lambda: calls.append(guard.elapsed()))
    shown: list[str] = []
    guard.notify = shown.append
    guard.start(GuardSettings(interval_s=0.05, limit_s=2.0, warnings_s=(1.5, 0.5)))
    wait_for(lambda: len(calls) == 2)
    assert calls[0] >= 0.5 and calls[1] >= 1.5  # not before the points (limit - 1.5 s, - 0.5 s)
    wait_for(lambda: guard.elapsed() > 2.3)  # past the limit: nothing more runs
    assert len(calls) == 2
    status = guard.status()
    assert status.next_warning_s is None and "next warning: none left" in str(status)
    warned = [text for text in shown if "left before the session limit (2 s, as given): "
              "running the deadline actions now" in text]
    assert len(warned) == 2
    assert sum(text.startswith("deadline actions (") and "ok - record: done" in text
               for text in shown) == 2


def test_points_already_passed_at_start_run_the_actions_once(actions: Any) -> None:
    calls: list[int] = []
    actions("record", lambda: calls.append(1))
    late = SessionGuard(started_at=time.time() - 100)  # both points passed long ago
    try:
        late.start(GuardSettings(interval_s=0.05, limit_s=90, warnings_s=(30, 10)))
        wait_for(lambda: calls)
        wait_for(lambda: any("the session limit has passed" in n for n in late.notices))
        late.start(GuardSettings(interval_s=0.05, limit_s=90, warnings_s=(30, 10)))  # replace
        time.sleep(0.2)  # several passes of the thread: a point fired again would show by now
        assert late.status().next_warning_s is None and calls == [1]
    finally:
        late.stop()


def test_the_automatic_checkpoint_is_saved_first(tmp_path: Path, guard: SessionGuard,
                                                 actions: Any) -> None:
    import torch

    model = torch.nn.Linear(3, 2)
    manager = CheckpointManager(tmp_path)
    auto.register(auto.AutoCheckpoint(manager=manager, collect=lambda: {"model": model},
                                      names=("model",), every_s=3600.0))
    seen: list[int] = []
    actions("after", lambda: seen.append(len(manager.list())))
    assert deadline.registered_actions() == ["checkpoint auto", "after"]
    run = guard.run_actions("test")
    assert [result.name for result in run.results] == ["checkpoint auto", "after"]
    assert seen == [1]  # the checkpoint was complete when the next action ran
    assert run.results[0].ok
    assert run.results[0].detail.startswith("checkpoint step-000000000: step 0,")
    restored = torch.nn.Linear(3, 2)
    manager.load({"model": restored})
    assert torch.equal(restored.weight, model.weight)


def test_a_failing_action_is_shown_and_the_others_still_run(
        tmp_path: Path, guard: SessionGuard, actions: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> None:
        raise OSError("disk\nfull")

    def unsaveable() -> dict[str, Any]:
        raise KeyError("model")

    auto.register(auto.AutoCheckpoint(manager=CheckpointManager(tmp_path), collect=unsaveable,
                                      names=("model",), every_s=3600.0))
    ran: list[str] = []

    def after() -> str:
        ran.append("after")
        return "synced 3 files"

    actions("broken", broken)
    actions("after", after)
    run = guard.run_actions("manual")
    assert ran == ["after"]
    assert [(result.name, result.ok) for result in run.results] == [
        ("checkpoint auto", False), ("broken", False), ("after", True)]
    assert isinstance(run.failures[1].error, OSError)
    expected = ("deadline actions (manual): 2 of 3 failed - checkpoint auto FAILED: KeyError: "
                "'model'; broken FAILED: OSError: disk full; after: synced 3 files")
    assert run.describe() == expected
    assert capsys.readouterr().err == f"ipycloud keepalive: {expected}\n"
    assert guard.status().last_run == expected
    assert guard.notices[-1].endswith(expected)


def test_a_second_trigger_joins_the_run_in_progress(guard: SessionGuard, actions: Any) -> None:
    active, most, entered, release = [0], [0], threading.Event(), threading.Event()
    lock = threading.Lock()

    def slow() -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        entered.set()
        release.wait(5)
        with lock:
            active[0] -= 1

    actions("slow", slow)
    runs: dict[str, deadline.ActionRun] = {}
    first = threading.Thread(target=lambda: runs.update(first=guard.run_actions("first")))
    second = threading.Thread(target=lambda: runs.update(second=guard.run_actions("second")))
    first.start()
    assert entered.wait(5)
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the first run, not running its own
    release.set()
    first.join(5)
    second.join(5)
    assert most[0] == 1 and runs["first"] is runs["second"] and len(runs["first"].results) == 1
    assert any("second: joined the run already in progress; deadline actions (first): ok"
               in notice for notice in guard.notices)
    entered.clear()
    assert guard.run_actions("third").reason == "third" and entered.is_set()  # runs again


def test_register_action_refuses_bad_input(actions: Any) -> None:
    for name, action, message in [
        ("", lambda: None, "a deadline action needs a name other than 'checkpoint auto', got ''"),
        ("checkpoint auto", lambda: None,
         "a deadline action needs a name other than 'checkpoint auto', got 'checkpoint auto'"),
        ("x", 3, "deadline action 'x' must be callable, got int"),
    ]:
        with pytest.raises(ValueError) as raised:
            register_action(name, action)  # type: ignore[arg-type]
        assert str(raised.value) == message
    actions("x", lambda: 1)
    actions("x", lambda: 2)  # replaces
    assert deadline.registered_actions() == ["x"]
    unregister_action("x")
    unregister_action("x")  # idempotent
    assert deadline.registered_actions() == []


# -- SIGTERM ----------------------------------------------------------------------------------


def test_stop_restores_the_sigterm_handler_exactly(guard: SessionGuard) -> None:
    def previous(signum: int, frame: FrameType | None) -> None:
        raise AssertionError("not called")

    for handler in (previous, signal.SIG_DFL, signal.SIG_IGN):
        signal.signal(signal.SIGTERM, handler)
        guard.start(GuardSettings(interval_s=1))
        guard.start(GuardSettings(interval_s=2))  # replaces the settings: one thread, one handler
        assert signal.getsignal(signal.SIGTERM) == guard._on_sigterm
        assert len(keepalive_threads()) == 1 and guard.status().interval_s == 2
        guard.stop()
        assert signal.getsignal(signal.SIGTERM) is handler
        wait_for(lambda: not keepalive_threads())


def test_sigterm_runs_the_actions_then_chains_to_the_previous_handler(
        guard: SessionGuard, actions: Any) -> None:
    received: list[int] = []

    def previous(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, previous)
    ran: list[str] = []

    def save_and_signal_again() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM during the grace period
        ran.append("saved")

    actions("save", save_and_signal_again)
    guard.start(GuardSettings(interval_s=60))
    os.kill(os.getpid(), signal.SIGTERM)
    wait_for(lambda: received)  # the handler runs on this (main) thread
    assert ran == ["saved"] and received == [signal.SIGTERM]
    assert not guard.running and signal.getsignal(signal.SIGTERM) is previous
    assert any("SIGTERM: running the deadline actions" in notice for notice in guard.notices)
    assert guard.status().last_run == "deadline actions (SIGTERM): ok - save: done"


def test_sigterm_waits_no_longer_than_the_grace_period(guard: SessionGuard,
                                                       actions: Any) -> None:
    received: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    release = threading.Event()
    actions("stuck", lambda: release.wait(10))
    guard.start(GuardSettings(interval_s=60, grace_s=0.2))
    os.kill(os.getpid(), signal.SIGTERM)
    wait_for(lambda: received)
    assert any("did not finish within 0.2 s; ending anyway" in notice for notice in guard.notices)
    run = deadline.last_run()
    assert run is not None and not run.done.is_set()  # still running, abandoned by SIGTERM
    release.set()
    wait_for(run.done.is_set)


def test_start_off_the_main_thread_cannot_guard_sigterm(guard: SessionGuard) -> None:
    before = signal.getsignal(signal.SIGTERM)
    starter = threading.Thread(target=guard.start, args=(GuardSettings(interval_s=1),))
    starter.start()
    starter.join()
    assert guard.running and signal.getsignal(signal.SIGTERM) is before
    assert guard.status().sigterm == "not guarded: start from the main thread to handle it"


# -- Colab's browser-side ping ---------------------------------------------------------------


def test_the_browser_script_calls_back_until_stopped(
        colab_callbacks: dict[str, Callable[..., Any]]) -> None:
    from playwright.sync_api import sync_playwright

    activity = BrowserActivity(interval_s=0.05)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=["--headless", "--no-sandbox"])
        try:
            page = browser.new_page()
            page.expose_function("kernelCall",
                                 lambda name, args: colab_callbacks[name](*args).data)
            page.evaluate("""() => {  // what Colab gives the scripts in its output frames
                window.calls = 0;
                window.answers = [];
                window.google = {colab: {kernel: {invokeFunction: async (name, args, kw) => {
                    window.calls += 1;
                    const answer = await window.kernelCall(name, args);
                    window.answers.push(answer.active);
                    return {data: {"application/json": answer}};
                }}}};
            }""")
            page.add_script_tag(content=activity.script())
            page.wait_for_function("window.calls >= 3", timeout=10_000)
            assert activity.pings >= 3 and activity.last_ping is not None
            activity.stop()
            page.wait_for_function("window.answers.includes(false)", timeout=10_000)
            calls = page.evaluate("window.calls")
            page.wait_for_timeout(300)  # six intervals: a timer still running would call again
            assert page.evaluate("window.calls") == calls
            assert page.evaluate("window.answers.filter(active => !active).length") == 1
        finally:
            browser.close()


def test_on_colab_the_browser_ping_is_on_by_default(
        monkeypatch: pytest.MonkeyPatch, colab_callbacks: dict[str, Callable[..., Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    on_colab = SessionGuard(started_at=time.time())
    try:
        on_colab.start(GuardSettings(interval_s=60))
        assert CALLBACK in (on_colab.browser_script or "")  # for the front to display
        assert on_colab.status().browser_pings == 0
        assert on_colab.status().limit_source == "Google Colab's limit"
        callback = colab_callbacks[CALLBACK]
        token = callback.__self__.token  # type: ignore[attr-defined]
        assert callback(token).data == {"active": True} and callback("stale").data == {
            "active": False}
        assert on_colab.status().browser_pings == 1
        on_colab.start(GuardSettings(interval_s=60, browser=False))
        assert on_colab.status().browser_pings is None
        assert callback(token).data == {"active": False}  # the displayed script stops
    finally:
        on_colab.stop()


# -- settings and the magic -------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "message"), [
    ({"interval_s": 0}, "the interval must be more than 0 s and at most 24 h, got 0 s"),
    ({"interval_s": -1}, "the interval must be more than 0 s and at most 24 h, got -1 s"),
    ({"interval_s": math.nan}, "the interval must be more than 0 s and at most 24 h, got nan s"),
    ({"interval_s": 2 * 86400}, "the interval must be more than 0 s and at most 24 h, got 48 h"),
    ({"limit_s": 31 * 86400}, "the session limit must be more than 0 s and at most 720 h, "
                              "got 744 h"),
    ({"grace_s": 3600}, "the grace period must be more than 0 s and at most 10 min, got 1 h"),
    ({"warnings_s": (60, -5)}, "the warning must be more than 0 s and at most 720 h, got -5 s"),
])
def test_settings_refuse_absurd_values(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        GuardSettings(**settings)
    assert str(raised.value) == message


def test_a_limit_shorter_than_the_warnings_is_refused(guard: SessionGuard) -> None:
    with pytest.raises(ValueError, match="^the session limit 10 min is not longer than the "
                                         r"15 min warning: give a longer limit"):
        guard.start(GuardSettings(limit_s=600, warnings_s=(300, 900)))
    assert not guard.running and not keepalive_threads()


def test_keepalive_magic_start_status_stop(shell: InteractiveShell) -> None:
    before = signal.getsignal(signal.SIGTERM)
    assert str(shell.run_line_magic("keepalive", "")).startswith("keepalive: stopped")
    status = shell.run_line_magic("keepalive", "start --interval 90s --limit 5h --warn 20m,5m")
    shell.run_line_magic("keepalive", "start --interval 2m --limit 6h --warn 30m,10m --grace 20s")
    assert len(keepalive_threads()) == 1
    status = shell.run_line_magic("keepalive", "status")
    lines = str(status).splitlines()
    assert lines[0] == "keepalive: running, a ping every 2 min (not in a Jupyter kernel, " \
                       "nothing to ping)"
    assert lines[1].startswith("Local machine: elapsed ") and " of 6 h (as given), " in lines[1]
    assert lines[2].startswith("next warning: in ") and lines[2].endswith(
        "(30 min before the limit)")
    assert lines[3] == "SIGTERM: guarded: deadline actions, then the process ends (grace 20 s)"
    assert status.time_left_s == pytest.approx(6 * 3600 - status.elapsed_s)
    assert signal.getsignal(signal.SIGTERM) is not before
    assert str(shell.run_line_magic("keepalive", "stop")) == (
        "keepalive stopped: no more pings or warnings, SIGTERM handler restored")
    assert signal.getsignal(signal.SIGTERM) is before
    wait_for(lambda: not keepalive_threads())
    assert str(shell.run_line_magic("keepalive", "stop")) == "keepalive was not running"


BAD_LINES = [
    ("bogus", "%keepalive: argument action: invalid choice: 'bogus' (choose from 'start', "
              "'stop', 'status') (see %keepalive? for usage)"),
    ("start --every 5", "%keepalive: unknown option --every (see %keepalive? for usage)"),
    ("start --interval 0", "%keepalive: argument --interval: '0' is not a positive duration "
                           "(see %keepalive? for usage)"),
    ("start --interval -5", "%keepalive: argument --interval: '-5' is not a duration: write it "
                            "like 90s, 10m, 1h30m or 2d (see %keepalive? for usage)"),
    ("start --interval -5m", "%keepalive: argument --interval: '-5m' is not a duration: write "
                             "it like 90s, 10m, 1h30m or 2d (see %keepalive? for usage)"),
    ("start --interval 2d", "%keepalive start: the interval must be more than 0 s and at most "
                            "24 h, got 48 h"),
    ("start --limit 10m --warn 15m", "%keepalive start: the session limit 10 min is not longer "
     "than the 15 min warning: give a longer limit or later warnings (e.g. 5m,1m)"),
    ("start --warn 5m,,1m", "%keepalive: argument --warn: '' is not a duration: write it like "
                            "90s, 10m, 1h30m or 2d (see %keepalive? for usage)"),
    ("start --limit 12x", "%keepalive: argument --limit: '12x' is not a duration: write it "
                          "like 90s, 10m, 1h30m or 2d (see %keepalive? for usage)"),
    ("start --grace 1h", "%keepalive start: the grace period must be more than 0 s and at most "
                         "10 min, got 1 h"),
    ("start --browser", "%keepalive start: the browser ping works only on Colab, where idle "
     "disconnects are decided in the browser; elsewhere the kernel ping keeps the Jupyter "
     "server active"),
    ("start --browser --no-browser", "%keepalive start: give --browser or --no-browser, not "
                                     "both"),
    ("stop --interval 5", "%keepalive: --interval does not apply to stop (see %keepalive? for "
                          "usage)"),
    ("status --no-browser", "%keepalive: --no-browser does not apply to status (see %keepalive? "
                            "for usage)"),
    ("start --interval '5", "%keepalive: No closing quotation (see %keepalive? for usage)"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[line for line, _ in BAD_LINES])
def test_bad_magic_lines_give_one_line(shell: InteractiveShell, line: str, message: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(UsageError) as raised:
        shell.run_line_magic("keepalive", line)
    assert str(raised.value) == message
    assert signal.getsignal(signal.SIGTERM) is before and not keepalive_threads()


@pytest.mark.parametrize(("pings", "last_ago", "shown"), [
    (3, 12.0, "3 browser pings, the last 12 s ago"),
    (0, None, "0 browser pings (none yet: is the notebook tab open?)"),
])
def test_status_says_when_the_browser_last_pinged(pings: int, last_ago: float | None,
                                                 shown: str) -> None:
    """A closed or sleeping Colab tab stops pinging: the status shows how long ago it last did."""
    from ipycloud.runtime.guard.status import GuardStatus

    status = GuardStatus(
        running=True, platform="Google Colab", elapsed_s=600.0, limit_s=43200.0,
        limit_source="Google Colab's limit", next_warning_s=42300.0, warnings_s=(900.0,),
        interval_s=60.0, kernel_pings=10, browser_pings=pings,
        browser_last_ping=None if last_ago is None else time.time() - last_ago,
        sigterm="guarded", actions=(), last_run=None, notices=())
    assert status.lines()[0] == ("keepalive: running, a ping every 1 min "
                                 f"(10 kernel pings sent, {shown})")
