"""Alerts when away: ``%notify`` keeps its URLs private and masked, ``fit`` tells a loopback
receiver how each run ended, a notifier that hangs or refuses never harms training, and
alerts of a kind are at most one a minute."""

from __future__ import annotations

import logging
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from alert_receiver import AlertReceiver
from fifo_reader import read_with_fifo_at
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from test_fit_callbacks import problem

import ipycloud
from ipycloud.runtime import notify
from ipycloud.runtime.guard.guard import GuardSettings, SessionGuard
from ipycloud.runtime.notify.sender import Alert, Notifier
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.early_stopping import EarlyStopping
from ipycloud.runtime.train.history import History

SECRET = "s3cret-token"


def train(**options: Any) -> History:
    model, optimizer, data = problem(32)
    return ipycloud.fit(model, optimizer, data, device="cpu", progress=False, **options)


def alerts_to(monkeypatch: pytest.MonkeyPatch, *urls: str) -> None:
    monkeypatch.setenv("IPYCLOUD_NOTIFY", ",".join(urls))


def sent(receiver: AlertReceiver) -> list[tuple[str, str]]:
    """(title, message) of each alert received, once the queue is empty."""
    assert notify.flush(30)
    return [(message["title"], message["message"]) for message in receiver.messages]


# -- where alerts go ----------------------------------------------------------------------

def test_a_saved_url_is_private_to_the_user_and_shown_only_masked(
        shell: InteractiveShell, config_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"ntfy://ntfy.sh/{SECRET}"
    added = shell.run_line_magic("notify", f"add {url}")
    assert str(added) == (f"alerts go to ntfy://ntfy.sh/… from now on (saved in "
                          f"{config_home / 'notify.json'}, readable by you only)")
    shell.run_line_magic("notify", "add 'tgram://123456789:AAH-bot-key/12315544/'")
    saved = config_home / "notify.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_home.stat().st_mode) == 0o700
    assert str(shell.run_line_magic("notify", "list")) == (
        "alerts go to:\n  1  ntfy://ntfy.sh/…\n  2  tgram://…")
    assert str(shell.run_line_magic("notify", "remove 1")) == (
        "alerts no longer go to ntfy://ntfy.sh/…")
    assert notify.urls.saved_urls() == ["tgram://123456789:AAH-bot-key/12315544/"]
    assert SECRET not in capsys.readouterr().out + saved.read_text()


@pytest.mark.parametrize("line", ["add bogus://x", "add 'not a url'", "add json://",
                                  "add ntfy:/topic"])
def test_a_url_apprise_cannot_read_is_refused_in_one_line_and_nothing_is_written(
        shell: InteractiveShell, config_home: Path, line: str) -> None:
    with pytest.raises(UsageError, match=r"^%notify add: .* is not a URL Apprise can send "
                                         r"to: see https://\S+ for each service's form$"):
        shell.run_line_magic("notify", line)
    assert not (config_home / "notify.json").exists()


def test_without_apprise_add_names_the_extra_and_fit_is_unaffected(
        shell: InteractiveShell, config_home: Path, monkeypatch: pytest.MonkeyPatch,
        alert_receiver: AlertReceiver, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "apprise", None)  # import apprise raises ImportError
    with pytest.raises(UsageError, match=r"^%notify add: apprise is required for this "
                                         r"feature: pip install 'ipycloud\[notify\]'$"):
        shell.run_line_magic("notify", "add ntfy://ntfy.sh/topic")
    assert not (config_home / "notify.json").exists()

    alerts_to(monkeypatch, alert_receiver.url())
    history = train(epochs=2)
    assert len(history.epochs) == 2
    assert sent(alert_receiver) == []
    assert "Apprise is missing: pip install 'ipycloud[notify]'" in caplog.text


def test_the_environment_adds_urls_that_the_list_marks_and_remove_refuses(
        shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch,
        alert_receiver: AlertReceiver) -> None:
    shell.run_line_magic("notify", f"add {alert_receiver.url('saved')}")
    alerts_to(monkeypatch, alert_receiver.url(f"env/{SECRET}"), " mailto://user:pw@gmail.com")
    port = alert_receiver.url("").split(":")[2].rstrip("/")
    assert str(shell.run_line_magic("notify", "list")) == (
        f"alerts go to:\n  1  json://127.0.0.1:{port}/…\n"
        f"  2  json://127.0.0.1:{port}/… ($IPYCLOUD_NOTIFY)\n"
        "  3  mailto://gmail.com/… ($IPYCLOUD_NOTIFY)")
    with pytest.raises(UsageError, match=r"^%notify remove: alert URL 2 comes from "
                                         r"\$IPYCLOUD_NOTIFY: change that variable"):
        shell.run_line_magic("notify", "remove 2")
    assert ipycloud.notify("failed", "title", "body")
    alert_receiver.wait_for(lambda receiver: len(receiver.messages) == 2)
    assert sorted(message["path"] for message in alert_receiver.messages) == [
        f"/env/{SECRET}", "/saved"]


def test_notify_test_sends_to_each_url_and_says_which_failed(
        shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch, alert_receiver: AlertReceiver,
        caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(UsageError, match=r"^%notify test: no alert URL is configured"):
        shell.run_line_magic("notify", "test")
    closed = closed_port()
    alerts_to(monkeypatch, alert_receiver.url(), f"json://127.0.0.1:{closed}/{SECRET}")
    caplog.set_level(logging.DEBUG)
    port = alert_receiver.url("").split(":")[2].rstrip("/")
    assert str(shell.run_line_magic("notify", "test")) == (
        f"test alert sent to json://127.0.0.1:{port}/…\n"
        f"test alert NOT sent to json://127.0.0.1:{closed}/…: A Connection error occurred "
        "sending JSON notification to 127.0.0.1.")
    assert [message["title"] for message in alert_receiver.messages] == ["ipycloud: test alert"]
    assert SECRET not in caplog.text


def test_a_server_that_answers_an_error_never_shows_the_topic(
        shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch, alert_receiver: AlertReceiver,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    alert_receiver.refuse(403, f"topic {SECRET} is reserved")  # a server that echoes it
    port = alert_receiver.url("").split(":")[2].rstrip("/")
    alerts_to(monkeypatch, f"ntfy://127.0.0.1:{port}/{SECRET}")
    answer = str(shell.run_line_magic("notify", "test"))
    assert answer == (f"test alert NOT sent to ntfy://127.0.0.1:{port}/…: Failed to send ntfy "
                      "notification to topic '***': topic *** is reserved, error=40301.")
    assert ipycloud.notify("failed", "title", "body")
    assert notify.flush(30)
    assert [message["topic"] for message in alert_receiver.messages] == [SECRET, SECRET]
    assert (f"the failed alert was not sent to ntfy://127.0.0.1:{port}/…: Failed to send "
            "ntfy notification to topic '***'") in caplog.text
    assert SECRET not in caplog.text


def test_adding_a_url_logs_no_part_of_it_even_at_debug_level(
        shell: InteractiveShell, config_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    shell.run_line_magic("notify", f"add ntfy://ntfy.sh/{SECRET}")
    with pytest.raises(UsageError, match=r"^%notify add: bogus://… is not a URL"):
        shell.run_line_magic("notify", f"add bogus://{SECRET}")
    assert notify.urls.saved_urls() == [f"ntfy://ntfy.sh/{SECRET}"]
    assert SECRET not in caplog.text


def test_a_fifo_in_place_of_notify_json_is_a_one_line_error_not_a_hang(
        shell: InteractiveShell, config_home: Path) -> None:
    config_home.mkdir(parents=True, mode=0o700)
    with pytest.raises(UsageError, match=rf"^%notify list: cannot read {config_home}/notify"
                                         r"\.json: not a regular file: fix or delete it$"):
        read_with_fifo_at(config_home / "notify.json",
                          lambda: shell.run_line_magic("notify", "list"))


def test_a_config_folder_others_can_write_is_made_private_before_use(
        shell: InteractiveShell, config_home: Path) -> None:
    config_home.mkdir(parents=True)
    config_home.chmod(0o777)
    shell.run_line_magic("notify", f"add ntfy://ntfy.sh/{SECRET}")
    assert stat.S_IMODE(config_home.stat().st_mode) == 0o700
    assert stat.S_IMODE((config_home / "notify.json").stat().st_mode) == 0o600


def test_a_config_folder_that_is_a_link_or_not_the_users_is_refused(
        shell: InteractiveShell, config_home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    config_home.parent.mkdir(parents=True)
    config_home.symlink_to(elsewhere)
    for line in (f"add ntfy://ntfy.sh/{SECRET}", "list"):
        with pytest.raises(UsageError, match=rf"^%notify \w+: {config_home} is a symbolic link: "
                                             r"ipycloud keeps alert URLs only in a folder "
                                             r"of yours \(see \$IPYCLOUD_CONFIG_DIR\)$"):
            shell.run_line_magic("notify", line)
    assert list(elsewhere.iterdir()) == []
    if os.geteuid() != 0:
        return  # only root can give a folder to another user
    config_home.unlink()
    config_home.mkdir(mode=0o700)
    os.chown(config_home, 65534, 65534)
    with pytest.raises(UsageError, match=rf"^%notify add: {config_home} belongs to another "
                                         r"user: ipycloud keeps alert URLs only in a folder "
                                         r"of yours \(see \$IPYCLOUD_CONFIG_DIR\)$"):
        shell.run_line_magic("notify", f"add ntfy://ntfy.sh/{SECRET}")
    assert list(config_home.iterdir()) == []


# -- what fit tells ----------------------------------------------------------------------

def test_fit_alerts_when_a_run_finishes_fails_and_pauses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alert_receiver: AlertReceiver) -> None:
    alerts_to(monkeypatch, alert_receiver.url())
    train(epochs=2, checkpoint=tmp_path / "run one")
    ((title, message),) = sent(alert_receiver)
    assert title == "ipycloud: training finished"
    assert message.startswith("step 8 of 8, epoch 2, after ")
    assert message.endswith(f"\ncheckpoints: {tmp_path / 'run one'}")

    def broken(outputs: Any, targets: Any) -> Any:
        if broken.calls == 2:  # type: ignore[attr-defined]
            raise ValueError("labels out of range\nsee the data")
        broken.calls += 1  # type: ignore[attr-defined]
        return torch.nn.functional.cross_entropy(outputs, targets)

    broken.calls = 0  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        train(epochs=1, loss_fn=broken)
    title, message = sent(alert_receiver)[1]
    assert title == "ipycloud: training failed"
    assert message.startswith("ValueError: labels out of range\nstep 2 of 4, epoch 0")

    class InterruptAt3(Callback):
        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        train(epochs=1, checkpoint=tmp_path / "run two", callbacks=[InterruptAt3()])
    title, message = sent(alert_receiver)[2]
    assert title == "ipycloud: training paused"
    assert message.startswith("FitInterrupted: ipycloud.fit: interrupted at step 3; rerun "
                              "this cell to continue\nstep 3 of 4, epoch 0")


def test_a_run_that_stops_early_says_why(monkeypatch: pytest.MonkeyPatch,
                                         alert_receiver: AlertReceiver) -> None:
    alerts_to(monkeypatch, alert_receiver.url())
    model, optimizer, data = problem(32)
    ipycloud.fit(model, optimizer, data, epochs=20, val_data=data, device="cpu",
                 progress=False, callbacks=[EarlyStopping("val_loss", patience=1, mode="max")])
    ((title, message),) = sent(alert_receiver)
    assert title == "ipycloud: training stopped early"
    assert message.startswith("early stop: val_loss has not improved for 1 epoch since epoch "
                              "0 (0.7424) (step 8)\nstep 8 of 80, epoch 2, after ")


def test_a_notifier_that_hangs_or_refuses_leaves_training_alone(
        monkeypatch: pytest.MonkeyPatch, alert_receiver: AlertReceiver,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    hanging = alert_receiver.url(f"hang/{SECRET}?rto=60")
    refused = f"json://127.0.0.1:{closed_port()}/{SECRET}"
    alerts_to(monkeypatch, hanging, refused)
    assert ipycloud.notify("deadline", "the session ends soon", "5 min left")
    alert_receiver.wait_for(lambda receiver: receiver.held == 1)

    history = train(epochs=2)  # its alert waits behind the one held

    assert [logs["epoch"] for logs in history.epochs] == [0, 1]
    assert alert_receiver.held == 1 and len(alert_receiver.messages) == 1
    alert_receiver.release()
    assert notify.flush(30)
    assert [message["title"] for message in alert_receiver.messages] == [
        "the session ends soon", "ipycloud: training finished"]
    assert "the finished alert was not sent to json://127.0.0.1:" in caplog.text
    assert SECRET not in caplog.text


# -- the other sources ---------------------------------------------------------------------

def test_the_session_guard_alerts_before_the_limit(monkeypatch: pytest.MonkeyPatch,
                                                  alert_receiver: AlertReceiver) -> None:
    alerts_to(monkeypatch, alert_receiver.url())
    guard = SessionGuard(started_at=0.0)  # the limit passed long ago
    guard.start(GuardSettings(interval_s=60, limit_s=3600, warnings_s=(300,)))
    try:
        alert_receiver.wait_for(lambda receiver: len(receiver.messages) == 1)
    finally:
        guard.stop()
    (message,) = alert_receiver.messages
    assert message["title"] == "ipycloud: the session ends soon"
    assert message["message"].startswith("the session limit has passed (1 h, as given) on ")
    assert message["type"] == "warning"


def test_alerts_of_a_kind_go_at_most_once_a_minute() -> None:
    now = [1000.0]
    delivered: list[Alert] = []
    notifier = Notifier(clock=lambda: now[0], send=delivered.append)
    assert notifier.notify("failed", "first", "")
    now[0] += 59.0
    assert not notifier.notify("failed", "within the minute", "")
    assert notifier.notify("paused", "another kind", "")
    now[0] += 1.0
    assert notifier.notify("failed", "a minute later", "")
    assert notifier.flush(10)
    notifier.close()
    assert [alert.title for alert in delivered] == ["first", "another kind", "a minute later"]


def closed_port() -> int:
    """A loopback port nothing listens on."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
