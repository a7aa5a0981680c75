"""``%mount_storage`` on a real IPython shell: real files and a real loopback HTTP server."""

from __future__ import annotations

import errno
import hashlib
import io
import re
import shlex
import tarfile
import time
from pathlib import Path

import pytest
from gdrive_server import FakeDrive
from http_server import LoopbackServer
from IPython.core.error import UsageError
from kaggle_server import KaggleServer, make_zip
from waiting import wait_for

from ipycloud.magics._errors import DownloadFailed
from ipycloud.runtime.storage.failed_syncs import failed_syncs, record_failure
from ipycloud.runtime.storage.gdrive import GdriveResult
from ipycloud.runtime.storage.kaggle import KaggleResult
from ipycloud.runtime.storage.mount import MountResult
from ipycloud.runtime.storage.periodic_sync import (
    BackgroundSync,
    background_sync_of,
    running_syncs,
)
from ipycloud.runtime.storage.sync import SyncReport


def tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_mount_then_download_verify_and_extract_into_the_project(
        shell, local_home: Path, http_server: LoopbackServer) -> None:
    mounted = shell.run_line_magic("mount_storage", "--project mnist")
    assert isinstance(mounted, MountResult)
    assert mounted.project == local_home / "ipycloud/mnist"
    data = tarball({"train/a.txt": b"alpha", "train/b.txt": b"beta"})
    http_server.add("/mnist.tar.gz", data)
    digest = hashlib.sha256(data).hexdigest()
    notice = shell.run_line_magic(
        "mount_storage", f"download {http_server.url('/mnist.tar.gz')} --sha256 {digest} --extract")
    assert str(notice).startswith(f"downloaded {mounted.project / 'data/mnist.tar.gz'}")
    assert "extracted 2 files into" in str(notice)
    assert (mounted.project / "data/mnist/train/b.txt").read_bytes() == b"beta"
    again = shell.run_line_magic("mount_storage",
                                 f"download {http_server.url('/mnist.tar.gz')} --sha256 {digest}")
    assert "already present and valid" in str(again)
    status = str(shell.run_line_magic("mount_storage", "status"))
    assert str(mounted.project) in status and "free space there:" in status


def test_a_wrong_checksum_is_one_line_and_leaves_nothing(
        shell, local_home: Path, http_server: LoopbackServer, tmp_path: Path) -> None:
    http_server.add("/file.bin", b"x" * 1000)
    with pytest.raises(DownloadFailed) as caught:
        shell.run_line_magic("mount_storage", f"download {http_server.url('/file.bin')} "
                                              f"--sha256 {'0' * 64} --dest {tmp_path / 'd'}")
    assert "checksum mismatch" in str(caught.value) and "\n" not in str(caught.value)
    assert list((tmp_path / "d").iterdir()) == []


def test_a_failed_download_ends_the_cell_with_one_line_of_its_own_kind(
        shell, local_home: Path, http_server: LoopbackServer, tmp_path: Path, capsys) -> None:
    url = http_server.url("/file.bin")
    http_server.add("/file.bin", b"x" * 1000)
    folder = tmp_path / "it's my data"
    result = shell.run_cell(f"%mount_storage download {url} --sha256 {'0' * 64} "
                            f"--dest {shlex.quote(str(folder))}")
    assert isinstance(result.error_in_exec, DownloadFailed)
    shown = re.sub(r"\x1b\[[\d;]*m", "", capsys.readouterr().out)  # without colours
    assert shown.strip().splitlines() == [
        f"DownloadFailed: %mount_storage download: {url}: checksum mismatch for file.bin: "
        f"sha256 expected {'0' * 64}, got {hashlib.sha256(b'x' * 1000).hexdigest()}"]


@pytest.mark.parametrize("below", ["", "/data", "/data/v 2"])
@pytest.mark.parametrize("action", ["download {url}", "gdrive 1AbCdEfGhIjKlMnOpQrStUvWxYz"])
def test_a_file_given_as_the_download_folder_is_one_line(
        shell, local_home: Path, http_server: LoopbackServer, tmp_path: Path, below,
        action) -> None:
    file = tmp_path / "notes 'v1'.txt"
    file.write_text("mine")
    line = action.format(url=http_server.url("/file.bin"))
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("mount_storage", f"{line} --dest {shlex.quote(str(file) + below)}")
    assert str(caught.value) == (f"%mount_storage {line.split()[0]}: {file} is a file, not a "
                                 "folder; give a folder with --dest")
    assert file.read_text() == "mine" and list(tmp_path.iterdir()) == [file]


def test_sync_now_and_in_the_background(shell, local_home: Path, tmp_path: Path) -> None:
    source = tmp_path / "outputs"
    source.mkdir()
    (source / "model.pt").write_bytes(b"weights")
    report = shell.run_line_magic("mount_storage", f"sync {source} {tmp_path / 'kept'}")
    assert isinstance(report, SyncReport) and report.copied == ("model.pt",)
    notice = shell.run_line_magic("mount_storage",
                                  f"sync {source} {tmp_path / 'later'} --every 0.2s")
    assert "in the background" in str(notice)
    (source / "log.txt").write_text("step 1")
    deadline = time.monotonic() + 5
    while not (tmp_path / "later/log.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "later/log.txt").read_text() == "step 1"
    assert "background sync:" in str(shell.run_line_magic("mount_storage", "status"))
    for background in running_syncs():
        background.stop()
    assert "background sync:" not in str(shell.run_line_magic("mount_storage", "status"))


def background_lines(shell) -> list[str]:
    status = str(shell.run_line_magic("mount_storage", "status"))
    return [line for line in status.splitlines() if line.startswith("background sync:")]


def test_one_background_sync_per_pair_replaced_then_stopped(
        shell, local_home: Path, tmp_path: Path) -> None:
    source, target, other = tmp_path / "my 'outputs'", tmp_path / 'kept "here"', tmp_path / "b"
    source.mkdir()
    (source / "a.txt").write_text("a")
    pair = f"{shlex.quote(str(source))} {shlex.quote(str(target))}"
    first = shell.run_line_magic("mount_storage", f"sync {pair} --every 10m")
    assert str(first) == (f"syncing {str(source)!r} -> {str(target)!r} every 10 min in the "
                          "background, and once more when the kernel exits")
    again = shell.run_line_magic("mount_storage", f"sync {pair} --every 5m --delete")
    assert str(again) == (f"syncing {str(source)!r} -> {str(target)!r} every 5 min with "
                          "--delete in the background (in place of the one every 10 min), and "
                          "once more when the kernel exits")
    shell.run_line_magic("mount_storage", f"sync {shlex.quote(str(source))} {other} --every 1h")
    lines = background_lines(shell)
    assert len(lines) == 2
    assert lines[0].startswith(f"background sync: {str(source)!r} -> {str(target)!r} every 5 min")
    assert lines[1].startswith(f"background sync: {str(source)!r} -> {str(other)!r} every 1 h")
    running = background_sync_of(source, target)
    assert running is not None and wait_for(lambda: running.last_report is not None)
    (source / "late.txt").write_text("late")  # after the first run: left to the final one
    stopped = shell.run_line_magic("mount_storage", f"sync {pair} --stop")
    assert str(stopped).startswith(f"stopped the background sync {str(source)!r} -> "
                                   f"{str(target)!r} after a final sync: ")
    assert (target / "late.txt").read_text() == "late"
    assert [line.split(" every")[0] for line in background_lines(shell)] == [
        f"background sync: {str(source)!r} -> {str(other)!r}"]
    every = shell.run_line_magic("mount_storage", "sync --stop")
    assert str(every).startswith(f"stopped the background sync {str(source)!r} -> "
                                 f"{str(other)!r} after a final sync: ")
    assert background_lines(shell) == [] and running_syncs() == []
    assert str(shell.run_line_magic("mount_storage", "sync --stop")) == (
        "no background sync is running")


def test_stopping_a_pair_that_is_not_running_names_it(
        shell, local_home: Path, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("mount_storage", f"sync {tmp_path / 'src'} {tmp_path / 'dst'} --stop")
    assert str(caught.value) == (
        f"%mount_storage sync: no background sync of {str(tmp_path / 'src')!r} -> "
        f"{str(tmp_path / 'dst')!r} is running (see %mount_storage status)")


def test_a_failed_final_sync_on_stop_is_one_line_that_says_what_to_run(
        shell, local_home: Path, tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "it's kept"
    source.mkdir()
    background = BackgroundSync(source, target, every_s=3600).start()
    assert wait_for(lambda: background.last_report is not None)
    target.rmdir()
    target.write_text("a file where the folder was")
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("mount_storage", "sync --stop")
    assert str(caught.value) == (
        f"%mount_storage sync: stopped 1 background sync, but the final sync of "
        f"{str(source)!r} -> {str(target)!r} failed: NotADirectoryError: [Errno 20] sync "
        f"destination {str(target)!r} is not a folder; run %mount_storage sync {source} "
        f"{shlex.quote(str(target))}")
    assert running_syncs() == []


def test_a_final_sync_that_failed_at_exit_is_shown_until_a_sync_of_the_pair_makes_up_for_it(
        shell, local_home: Path, tmp_path: Path) -> None:
    source, target = tmp_path / "my outputs", tmp_path / "it's kept"
    source.mkdir()
    (source / "a.txt").write_text("a")
    failure = record_failure(source, target, OSError(errno.ENOTCONN,
                                                     "Transport endpoint is not connected"))
    status = str(shell.run_line_magic("mount_storage", "status")).splitlines()
    assert status[-1] == (
        f"failed final sync: the final sync of {str(source)!r} -> {str(target)!r} at exit "
        f"({failure.when()}) failed: OSError: [Errno 107] Transport endpoint is not connected; "
        f"run %mount_storage sync {shlex.quote(str(source))} {shlex.quote(str(target))}")
    started = shell.run_line_magic(
        "mount_storage", f"sync {shlex.quote(str(source))} {shlex.quote(str(target))} --every 1h")
    assert str(started).splitlines()[1] == (
        f"it makes up for the final sync at exit ({failure.when()}), which failed: "
        "OSError: [Errno 107] Transport endpoint is not connected")
    assert wait_for(lambda: failed_syncs() == [])
    assert (target / "a.txt").read_text() == "a"
    assert "failed final sync" not in str(shell.run_line_magic("mount_storage", "status"))


def test_status_lists_a_background_sync_started_from_python(
        shell, local_home: Path, tmp_path: Path) -> None:
    source = tmp_path / "outputs"
    source.mkdir()
    background = BackgroundSync(source, tmp_path / "kept", every_s=3600).start()
    try:
        status = str(shell.run_line_magic("mount_storage", "status"))
        kept = tmp_path / "kept"
        assert f"background sync: {str(source)!r} -> {str(kept)!r} every 1 h, running, " in status
        assert "<" not in status and "0x" not in status
    finally:
        background.stop(final=False)


def test_extract_refuses_a_download_that_is_no_archive(
        shell, tmp_path: Path, http_server: LoopbackServer) -> None:
    http_server.add("/notes.txt", b"plain text, not an archive")
    with pytest.raises(UsageError, match=r"notes\.txt.* not a zip or tar") as caught:
        shell.run_line_magic("mount_storage", f"download {http_server.url('/notes.txt')} "
                                              f"--dest {tmp_path} --extract")
    assert "\n" not in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_extraction_limit_is_an_option_named_in_its_error(
        shell, tmp_path: Path, http_server: LoopbackServer) -> None:
    http_server.add("/zeros.tar.gz", tarball({"zeros.bin": bytes(5000)}))
    url = http_server.url("/zeros.tar.gz")
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("mount_storage", f'download {url} --dest "{tmp_path}/my data" '
                                              "--extract --max-total-bytes 4KiB")
    message = str(caught.value)
    assert "more than 4.0 KiB (4096 bytes)" in message and "--max-total-bytes" in message
    assert "max_total_bytes=" not in message and "\n" not in message
    assert [p.name for p in (tmp_path / "my data").iterdir()] == ["zeros.tar.gz"]
    notice = shell.run_line_magic("mount_storage", f'download {url} --dest "{tmp_path}/my data" '
                                                   "--extract --max-total-bytes 1M")
    assert "extracted 1 file into" in str(notice)
    assert (tmp_path / "my data/zeros/zeros.bin").read_bytes() == bytes(5000)


@pytest.mark.parametrize(("line", "message"), [
    ("s3", "invalid choice: 's3'"),
    ("download", "expected 1 argument, got nothing"),
    ("download ftp://example.org/x", "download:"),
    ("download not-a-url", "download:"),
    ("sync onlyone", "expected 2 arguments, got onlyone"),
    ("sync {tmp}/missing {tmp}/dst", "sync:"),
    ("sync {tmp}/src {tmp}/src/inner", "sync:"),
    ("sync {tmp}/src {tmp}/dst --every soon", "'soon' is not a duration"),
    ("sync {tmp}/src {tmp}/dst --every 1m --dry-run", "--dry-run and --every do not go"),
    ("sync", "expected 2 arguments, got nothing; usage: %mount_storage sync SRC DST"),
    ("sync '{tmp}/my src' --stop", "expected 0 or 2 arguments, got '/"),  # quoted back
    ("sync --stop --every 1m", "--every does not apply to sync --stop"),
    ("sync {tmp}/src {tmp}/dst --stop --dry-run", "--dry-run does not apply to sync --stop"),
    ("status --stop", "--stop does not apply to status"),
    ("status extra", "expected 0 arguments, got extra"),
    ("kaggle a/b c/d", "expected 1 argument, got a/b c/d"),
    ("kaggle not/a/valid/handle", "kaggle:"),
    ("kaggle alice", "kaggle:"),
    ("kaggle --competition", "--competition does not apply to mount"),
    ("gdrive", "expected 1 argument, got nothing"),
    ("gdrive https://example.org/file/d/abc", "gdrive:"),
    ("download https://example.org/x.zip --competition", "--competition does not apply"),
    ("download https://example.org/x.zip --max-total-bytes 1G", "--max-total-bytes goes with"),
    ("download https://example.org/x.zip --extract --max-total-bytes lots", "'lots' is not a size"),
    ("sync {tmp}/src {tmp}/dst --extract", "--extract does not apply to sync"),
    ("local --sha256 00", "--sha256 does not apply to mount"),
    ("drive", "drive storage is not available on Local machine"),
    ("local --project ../up", "invalid project name '../up'"),
])
def test_bad_lines_give_one_line_usage_errors(shell, local_home: Path, tmp_path: Path,
                                              line: str, message: str) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("mount_storage", line.format(tmp=tmp_path))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_help_page_has_examples(shell) -> None:
    doc = shell.find_line_magic("mount_storage").__doc__
    assert "Examples" in doc and "%mount_storage sync outputs" in doc and "--sha256" in doc
    assert "%mount_storage sync outputs /content/drive/MyDrive/runs --stop" in doc
    assert "%mount_storage sync --stop" in doc and "--stop" in doc


def test_kaggle_dataset_into_the_project_then_skipped(
        shell, local_home: Path, kaggle_server: KaggleServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    kaggle_server.add_user("alice", "0123456789abcdef0123456789abcdef")
    monkeypatch.setenv("KAGGLE_USERNAME", "alice")
    monkeypatch.setenv("KAGGLE_KEY", "0123456789abcdef0123456789abcdef")
    kaggle_server.add_dataset("alice/iris", make_zip({"iris.csv": b"sepal,petal\n"}))
    mounted = shell.run_line_magic("mount_storage", "--project flowers")
    result = shell.run_line_magic("mount_storage", "kaggle alice/iris")
    assert isinstance(result, KaggleResult) and not result.skipped
    assert result.path == mounted.project / "data/kaggle/alice/iris"
    assert (result.path / "iris.csv").read_bytes() == b"sepal,petal\n"
    again = shell.run_line_magic("mount_storage", "kaggle alice/iris")
    assert again.skipped and again.path == result.path
    assert "0123456789abcdef" not in str(again) + repr(again)


def test_gdrive_file_by_share_link_is_verified(
        shell, local_home: Path, gdrive_server: FakeDrive, tmp_path: Path) -> None:
    shared = gdrive_server.add_file("weights.bin", b"drive bytes")
    digest = hashlib.sha256(b"drive bytes").hexdigest()
    link = f"https://drive.google.com/file/d/{shared.id}/view?usp=sharing"
    result = shell.run_line_magic("mount_storage",
                                  f"gdrive {link} --sha256 {digest} --dest {tmp_path / 'w'}")
    assert isinstance(result, GdriveResult) and result.sha256 == digest
    assert (tmp_path / "w/weights.bin").read_bytes() == b"drive bytes"
    with pytest.raises(DownloadFailed, match="checksum mismatch") as caught:
        shell.run_line_magic("mount_storage", f"gdrive {shared.id} --sha256 {'0' * 64} "
                                              f"--dest {tmp_path / 'bad'} --force")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "bad/weights.bin").exists()


def test_a_kaggle_handle_mistake_names_the_option_in_the_magic_and_the_parameter_in_python(
        shell) -> None:
    from ipycloud.runtime.storage.kaggle import kaggle_download

    with pytest.raises(ValueError) as in_python:
        kaggle_download("{no-owner}")
    assert str(in_python.value).endswith("(a competition: competition=True)")
    assert "'{no-owner}'" in str(in_python.value)
    with pytest.raises(UsageError) as in_magic:
        shell.run_line_magic("mount_storage", "kaggle no-owner")
    assert str(in_magic.value) == (
        "%mount_storage kaggle: invalid Kaggle dataset handle 'no-owner': use OWNER/DATASET "
        "or OWNER/DATASET/versions/N (a competition: --competition)")


def test_messages_name_the_magics_options_not_python_parameters(
        shell, local_home: Path, gdrive_server: FakeDrive, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as not_here:
        shell.run_line_magic("mount_storage", "drive")
    assert str(not_here.value).startswith("%mount_storage drive: drive storage is not "
                                          "available on ")
    assert str(not_here.value).endswith(": use %mount_storage auto or %mount_storage local")
    top = gdrive_server.add_folder("Mine", [gdrive_server.add_file("a.txt", b"aa").id])
    (tmp_path / "Mine").mkdir()
    with pytest.raises(DownloadFailed) as taken:
        shell.run_line_magic("mount_storage", f"gdrive https://drive.google.com/drive/folders/"
                                              f"{top} --dest {tmp_path}")
    assert str(taken.value).endswith(": pass --force to replace it")
