"""kaggle_download through kagglehub's real code, against a fake Kaggle on 127.0.0.1."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import random
import re
import shutil
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from fifo_reader import read_with_fifo_at
from kaggle_server import KaggleServer, closed_port, make_zip
from kagglehub.clients import CHUNK_SIZE as CHUNK

from ipycloud.runtime.machine.platform import detect_platform
from ipycloud.runtime.storage.kaggle import (
    MANIFEST,
    KaggleError,
    KaggleResult,
    _Handle,
    _Job,
    kaggle_download,
)
from ipycloud.runtime.storage.kaggle_credentials import KaggleAuth, _read_kaggle_json, _secrets
from ipycloud.runtime.storage.mount import mount

USER, KEY = "alice", "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
TOKEN = base64.b64encode(f"{USER}:{KEY}".encode()).decode()
FILES = {"iris.csv": b"sepal,petal\n5.1,1.4\n", "docs/readme.txt": b"the iris data\n"}
GET_DATASET = "datasets.DatasetApiService/GetDataset"
DOWNLOAD_DATASET = "datasets.DatasetApiService/DownloadDataset"
DOWNLOAD_COMPETITION = "competitions.CompetitionApiService/DownloadDataFiles"


@pytest.fixture
def env_user(kaggle_server: KaggleServer, monkeypatch: pytest.MonkeyPatch) -> KaggleServer:
    """The fake Kaggle with alice's key given in KAGGLE_USERNAME / KAGGLE_KEY."""
    kaggle_server.add_user(USER, KEY)
    monkeypatch.setenv("KAGGLE_USERNAME", USER)
    monkeypatch.setenv("KAGGLE_KEY", KEY)
    return kaggle_server


@pytest.fixture
def project(kaggle_server: KaggleServer, tmp_path: Path) -> Path:
    """A mounted local project folder under tmp_path/storage."""
    platform = detect_platform(environ={"HOME": str(tmp_path / "home")}, root=tmp_path)
    return mount("local", root=tmp_path / "storage", platform=platform).project


def files_under(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` except the manifest, by relative name."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != MANIFEST}


def leftovers(folder: Path) -> list[str]:
    """Temporary entries (ours and durable's) left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


def assert_nothing_at(dest: Path) -> None:
    """The destination does not exist and no temporary folder of it is left beside it."""
    assert not dest.exists()
    if dest.parent.exists():
        assert leftovers(dest.parent) == []


def users_seen(server: KaggleServer) -> list[str | None]:
    return [call.user for call in server.calls]


def storage_gets(server: KaggleServer) -> list[tuple[str | None, int]]:
    return [(r.range, r.status) for r in server.requests if r.method == "GET"]


# -- downloads ------------------------------------------------------------------------------
def test_dataset_lands_in_the_project_with_a_manifest(env_user: KaggleServer, project: Path,
                                                      tmp_path: Path) -> None:
    env_user.add_dataset("alice/iris", make_zip(FILES), version=3)
    res = kaggle_download("alice/iris", progress=False)
    dest = project / "data" / "kaggle" / "alice" / "iris"
    assert res == KaggleResult(dest, "alice/iris", 2, sum(map(len, FILES.values())), False, 3)
    assert files_under(dest) == FILES
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["handle"] == "alice/iris" and manifest["version"] == 3
    assert manifest["files"] == [["docs/readme.txt", 14], ["iris.csv", 20]]
    assert leftovers(dest.parent) == [] and leftovers(dest) == []
    # kagglehub pinned the version we asked for, and the files left its cache (stored once)
    assert [(c.name, c.body.get("datasetVersionNumber")) for c in env_user.calls] == [
        (GET_DATASET, None), (DOWNLOAD_DATASET, 3)]
    assert users_seen(env_user) == [USER, USER]
    assert not (tmp_path / "kagglehub-cache" / "datasets" / "alice" / "iris" / "versions"
                / "3").exists()
    # the archive came from the storage host, without the key (requests drops it on redirect)
    archive = [r for r in env_user.requests if r.method == "GET"]
    assert [(r.headers["Host"], "Authorization" in r.headers) for r in archive] == [
        ("storage.kaggle.test", False)]


def test_second_call_is_skipped_without_a_request(env_user: KaggleServer, project: Path) -> None:
    env_user.add_dataset("alice/iris", make_zip(FILES))
    first = kaggle_download("alice/iris", progress=False)
    seen = len(env_user.requests)
    again = kaggle_download("alice/iris", progress=False)
    assert len(env_user.requests) == seen
    assert again == KaggleResult(first.path, "alice/iris", 2, first.size, True, 1)
    assert "skipped" in str(again)


def test_a_damaged_download_is_fetched_again(env_user: KaggleServer, project: Path) -> None:
    env_user.add_dataset("alice/iris", make_zip(FILES))
    first = kaggle_download("alice/iris", progress=False)
    (first.path / "iris.csv").write_bytes(b"truncated")
    again = kaggle_download("alice/iris", progress=False)
    assert not again.skipped and files_under(again.path) == FILES


def test_force_downloads_again_and_replaces(env_user: KaggleServer, tmp_path: Path) -> None:
    env_user.add_dataset("alice/iris", make_zip(FILES))
    dest = tmp_path / "here"
    kaggle_download("alice/iris", dest, progress=False)
    seen = len(env_user.requests)
    env_user.add_dataset("alice/iris", make_zip({"new.csv": b"new\n"}))
    res = kaggle_download("alice/iris", dest, force=True, progress=False)
    assert not res.skipped and len(env_user.requests) == seen + 3
    assert files_under(dest) == {"new.csv": b"new\n"}
    assert leftovers(tmp_path) == []


def test_versioned_handles(env_user: KaggleServer, tmp_path: Path) -> None:
    env_user.add_dataset("alice/iris", make_zip({"v.txt": b"one"}), version=1)
    env_user.add_dataset("alice/iris", make_zip({"v.txt": b"two"}), version=2)
    old = kaggle_download("alice/iris/versions/1", progress=False)
    assert (old.version, old.handle) == (1, "alice/iris/versions/1")
    assert files_under(old.path) == {"v.txt": b"one"}
    assert old.path == tmp_path / "data" / "kaggle" / "alice" / "iris"  # no mount: cwd
    assert [c.body.get("datasetVersionNumber") for c in env_user.calls] == [None, 1]
    # the unversioned handle accepts the version already there; another version replaces it
    assert kaggle_download("alice/iris", progress=False).skipped
    new = kaggle_download("alice/iris/versions/2", progress=False)
    assert (new.skipped, new.version, files_under(new.path)) == (False, 2, {"v.txt": b"two"})
    assert new.summary().startswith("Kaggle alice/iris/versions/2: 1 file, 3 B in ")


def test_competition_download(env_user: KaggleServer, tmp_path: Path) -> None:
    env_user.add_competition("titanic", make_zip({"train.csv": b"a\n", "test.csv": b"b\n"}),
                             accepted=(USER,))
    res = kaggle_download("titanic", competition=True, progress=False)
    dest = tmp_path / "data" / "kaggle" / "competitions" / "titanic"
    assert (res.path, res.files, res.skipped, res.version) == (dest, 2, False, None)
    assert files_under(dest) == {"train.csv": b"a\n", "test.csv": b"b\n"}
    assert [(c.name, c.body, c.user) for c in env_user.calls] == [
        (DOWNLOAD_COMPETITION, {"competitionName": "titanic"}, USER)]
    assert kaggle_download("titanic", competition=True, progress=False).skipped
    assert len(env_user.calls) == 1


def test_public_dataset_needs_no_credentials(kaggle_server: KaggleServer) -> None:
    kaggle_server.add_dataset("bob/digits", make_zip({"d.csv": b"1\n"}))
    res = kaggle_download("bob/digits", progress=False)
    assert files_under(res.path) == {"d.csv": b"1\n"}
    assert users_seen(kaggle_server) == [None, None]
    assert all("Authorization" not in r.headers for r in kaggle_server.requests)


# -- handles --------------------------------------------------------------------------------
@pytest.mark.parametrize(("handle", "competition"), [
    ("", False), ("iris", False), ("alice/", False), ("/iris", False), ("alice/iris/", False),
    ("alice/iris/versions", False), ("alice/iris/versions/0", False),
    ("alice/iris/versions/x", False), ("alice/iris/v/1", False), ("a/b/c", False),
    ("alice/..", False), ("alice/ir is", False), ("alice/iris\n", False),
    ("https://www.kaggle.com/datasets/alice/iris", False), (None, False), (3, False),
    ("alice/iris", True), ("", True), ("../x", True), ("titanic?x=1", True), ("-x", True),
])
def test_malformed_handles_raise_before_any_request(
    kaggle_server: KaggleServer, handle: object, competition: bool
) -> None:
    with pytest.raises(ValueError) as err:
        kaggle_download(handle, competition=competition)  # type: ignore[arg-type]
    message = str(err.value)
    assert "\n" not in message and ("competition" in message or "OWNER/DATASET" in message)
    assert kaggle_server.requests == []


# -- failures -------------------------------------------------------------------------------
def test_unknown_dataset_is_a_one_line_404(env_user: KaggleServer, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "nope"
    with pytest.raises(KaggleError) as err:
        kaggle_download("alice/nope", dest, progress=False)
    message = str(err.value)
    assert "\n" not in message and "404" in message and "alice/nope" in message
    assert "https://www.kaggle.com/datasets/alice/nope" in message
    assert_nothing_at(dest)
    assert err.value.__context__ is None and err.value.__cause__ is None


def test_unknown_version_is_a_404_after_the_lookup(env_user: KaggleServer, tmp_path: Path) -> None:
    env_user.add_dataset("alice/iris", make_zip(FILES))
    dest = tmp_path / "iris"
    with pytest.raises(KaggleError, match=r"no version 9 of dataset alice/iris/versions/9"):
        kaggle_download("alice/iris/versions/9", dest, progress=False)
    assert [c.status for c in env_user.calls] == [200, 404]
    assert_nothing_at(dest)


def test_wrong_key_is_a_401_without_the_key(kaggle_server: KaggleServer,
                                            monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    kaggle_server.add_user(USER, "another-key")
    kaggle_server.add_dataset("alice/iris", make_zip(FILES))
    monkeypatch.setenv("KAGGLE_USERNAME", USER)
    monkeypatch.setenv("KAGGLE_KEY", KEY)
    with pytest.raises(KaggleError) as err:
        kaggle_download("alice/iris", tmp_path / "iris", progress=False)
    message = str(err.value)
    assert "401" in message and "KAGGLE_USERNAME/KAGGLE_KEY" in message and "\n" not in message
    assert KEY not in message + repr(err.value) and TOKEN not in message
    assert_nothing_at(tmp_path / "iris")


def test_competition_rules_not_accepted_is_a_403(env_user: KaggleServer, tmp_path: Path) -> None:
    env_user.add_competition("titanic", make_zip({"t.csv": b"x"}))
    with pytest.raises(KaggleError) as err:
        kaggle_download("titanic", tmp_path / "t", competition=True, progress=False)
    message = str(err.value)
    assert "403" in message and "\n" not in message and KEY not in message
    assert "accept the rules at https://www.kaggle.com/competitions/titanic/rules" in message
    assert_nothing_at(tmp_path / "t")


def test_private_dataset_without_credentials_lists_the_places(
    kaggle_server: KaggleServer, project: Path
) -> None:
    kaggle_server.add_dataset("carol/secret", make_zip(FILES), private=True)
    with pytest.raises(KaggleError) as err:
        kaggle_download("carol/secret", progress=False)
    message = str(err.value)
    assert "403" in message and "KAGGLE_USERNAME" in message and "\n" not in message
    assert str(Path(os.environ["HOME"]) / ".kaggle") in message
    assert str(project / "kaggle.json") in message
    assert_nothing_at(project / "data" / "kaggle" / "carol" / "secret")


def test_competition_without_credentials_asks_nothing(
    kaggle_server: KaggleServer, tmp_path: Path
) -> None:
    kaggle_server.add_competition("titanic", make_zip({"t.csv": b"x"}), accepted=(USER,))
    with pytest.raises(KaggleError, match="needs Kaggle credentials: set KAGGLE_USERNAME"):
        kaggle_download("titanic", competition=True)
    assert kaggle_server.requests == []


def test_connection_refused(env_user: KaggleServer, monkeypatch: pytest.MonkeyPatch,
                            tmp_path: Path) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(KaggleError) as err:
        kaggle_download("alice/iris", tmp_path / "iris", progress=False)
    message = str(err.value)
    assert message.startswith("cannot reach Kaggle for dataset alice/iris")
    assert "Connection refused" in message and "\n" not in message
    assert_nothing_at(tmp_path / "iris")


def test_dropped_connection_then_rerun_resumes(env_user: KaggleServer, tmp_path: Path) -> None:
    # kagglehub writes whole chunks (1 MiB): cut in the second one, it keeps the first
    big = random.Random(7).randbytes(5 * CHUNK // 2)  # incompressible: the zip is as large
    archive = make_zip({"big.bin": big})
    env_user.add_dataset("alice/big", archive, drop_after=3 * CHUNK // 2)
    dest = tmp_path / "big"
    with pytest.raises(KaggleError) as err:
        kaggle_download("alice/big", dest, progress=False)
    assert "cut off" in str(err.value) and "rerun" in str(err.value)
    assert_nothing_at(dest)
    part = tmp_path / "kagglehub-cache" / "datasets" / "alice" / "big" / "1.archive"
    assert part.stat().st_size == CHUNK  # kagglehub kept the partial archive
    res = kaggle_download("alice/big", dest, progress=False)
    assert files_under(dest) == {"big.bin": big} and res.size == len(big)
    # kagglehub's resume: it opens the archive once more, then asks for the rest by Range
    assert storage_gets(env_user) == [(None, 200), (None, 200), (f"bytes={CHUNK}-", 206)]
    assert not part.exists()


def test_no_free_space_refuses_before_downloading(env_user: KaggleServer,
                                                  tmp_path: Path) -> None:
    larger = shutil.disk_usage(tmp_path).total + 1  # more than the disk holds
    env_user.add_dataset("alice/huge", make_zip(FILES), total_bytes=larger)
    with pytest.raises(KaggleError, match=rf"not enough free space in {tmp_path} .* need "):
        kaggle_download("alice/huge", tmp_path / "huge", progress=False)
    assert [c.name for c in env_user.calls] == [GET_DATASET]
    assert storage_gets(env_user) == []
    assert_nothing_at(tmp_path / "huge")


def test_foreign_files_at_dest_need_force(env_user: KaggleServer, tmp_path: Path) -> None:
    env_user.add_dataset("alice/iris", make_zip(FILES))
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    with pytest.raises(KaggleError, match="already holds other files"):
        kaggle_download("alice/iris", dest, progress=False)
    assert env_user.requests == [] and (dest / "notes.txt").exists()
    kaggle_download("alice/iris", dest, force=True, progress=False)
    assert files_under(dest) == FILES


def test_leftovers_of_a_dead_run_are_removed(env_user: KaggleServer, tmp_path: Path) -> None:
    env_user.add_dataset("alice/iris", make_zip(FILES))
    stale = tmp_path / ".tmp-999999999-0000abcd-iris"
    (stale / "half").mkdir(parents=True)
    kaggle_download("alice/iris", tmp_path / "iris", progress=False)
    assert not stale.exists()


def test_missing_kagglehub_names_the_extra(kaggle_server: KaggleServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kagglehub", None)
    with pytest.raises(ImportError, match=r"pip install 'ipycloud\[kaggle\]'"):
        kaggle_download("alice/iris")


# -- credentials ----------------------------------------------------------------------------
def write_json(path: Path, content: object, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))
    path.chmod(mode)
    return path


def test_credentials_from_home_kaggle_json(kaggle_server: KaggleServer,
                                           tmp_path: Path) -> None:
    kaggle_server.add_user("filer", KEY)
    kaggle_server.add_dataset("filer/data", make_zip(FILES), private=True)
    write_json(tmp_path / "home" / ".kaggle" / "kaggle.json", {"username": "filer", "key": KEY})
    kaggle_download("filer/data", progress=False)
    assert users_seen(kaggle_server) == ["filer", "filer"]


def test_credentials_from_kaggle_config_dir(kaggle_server: KaggleServer,
                                            monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    kaggle_server.add_user("cfg", KEY)
    kaggle_server.add_dataset("cfg/data", make_zip(FILES), private=True)
    write_json(tmp_path / "conf" / "kaggle.json", {"username": "cfg", "key": KEY})
    write_json(tmp_path / "home" / ".kaggle" / "kaggle.json", {"username": "filer", "key": "x"})
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path / "conf"))
    kaggle_download("cfg/data", progress=False)
    assert users_seen(kaggle_server) == ["cfg", "cfg"]


def test_environment_wins_over_files(env_user: KaggleServer, project: Path,
                                     tmp_path: Path) -> None:
    write_json(tmp_path / "home" / ".kaggle" / "kaggle.json", {"username": "filer", "key": "x"})
    write_json(project / "kaggle.json", {"username": "proj", "key": "y"})
    env_user.add_dataset("alice/iris", make_zip(FILES), private=True)
    kaggle_download("alice/iris", progress=False)
    assert users_seen(env_user) == [USER, USER]


class ModeWatch:
    """Modes of the files in one folder, looked at on every audit event of the main thread.

    Any step of a copy (open, chmod, rename...) raises an audit event, so a file created
    readable by others and tightened later is seen with its loose mode.
    """

    folder: Path | None = None
    busy = False
    seen: ClassVar[set[tuple[str, int]]] = set()

    @classmethod
    def hook(cls, event: str, args: tuple[object, ...]) -> None:
        if cls.folder is None or cls.busy or threading.current_thread() is not MAIN:
            return
        cls.busy = True
        try:
            with os.scandir(cls.folder) as entries:
                for entry in entries:
                    mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
                    cls.seen.add((entry.name, mode))
        except OSError:
            pass
        finally:
            cls.busy = False


MAIN = threading.main_thread()
sys.addaudithook(ModeWatch.hook)


@pytest.mark.parametrize("where", ["project", "storage root"])
def test_project_kaggle_json_is_copied_with_mode_600(
    kaggle_server: KaggleServer, project: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], where: str,
) -> None:
    kaggle_server.add_user("proj", KEY)
    kaggle_server.add_dataset("proj/data", make_zip(FILES), private=True)
    folder = project if where == "project" else project.parent
    source = write_json(folder / "kaggle.json", {"username": "proj", "key": KEY}, 0o644)
    copied = tmp_path / "home" / ".kaggle" / "kaggle.json"
    old_umask = os.umask(0)  # the mode must not come from the umask
    ModeWatch.folder, ModeWatch.seen = copied.parent, set()
    try:
        kaggle_download("proj/data", progress=False)
    finally:
        ModeWatch.folder = None
        os.umask(old_umask)
    assert stat.S_IMODE(copied.stat().st_mode) == 0o600
    assert ModeWatch.seen and {mode for _, mode in ModeWatch.seen} == {0o600}
    assert copied.read_bytes() == source.read_bytes()
    assert users_seen(kaggle_server) == ["proj", "proj"]
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "copied" in line]
    assert notes == [f"ipycloud: copied {source} to {copied} (mode 600) for kagglehub"]
    assert KEY not in out
    assert [p.name for p in copied.parent.iterdir()] == ["kaggle.json"]


@pytest.mark.parametrize("content", ['{"username": "u", "kee": "SECRET-VALUE-42"}',
                                     "SECRET-VALUE-42", '["SECRET-VALUE-42"]', ""])
@pytest.mark.parametrize("where", ["home", "project"])
def test_malformed_kaggle_json_names_the_file_not_its_content(
    kaggle_server: KaggleServer, project: Path, tmp_path: Path,
    content: str, where: str,
) -> None:
    path = (tmp_path / "home" / ".kaggle" if where == "home" else project) / "kaggle.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    kaggle_server.add_dataset("alice/iris", make_zip(FILES))
    with pytest.raises(KaggleError) as err:
        kaggle_download("alice/iris", progress=False)
    message = str(err.value)
    assert message.startswith(f"{path} is not a valid kaggle.json") and "\n" not in message
    assert "SECRET" not in message + repr(err.value)
    assert err.value.__context__ is None
    assert kaggle_server.requests == []
    if where == "project":
        assert not (tmp_path / "home" / ".kaggle" / "kaggle.json").exists()


def test_a_fifo_in_place_of_kaggle_json_is_a_one_line_error_not_a_hang(
        tmp_path: Path) -> None:
    path = tmp_path / "kaggle.json"
    with pytest.raises(KaggleError, match=rf"^cannot read {re.escape(str(path))}: not a "
                                          r"regular file$"):
        read_with_fifo_at(path, lambda: _read_kaggle_json(path))


def test_a_kaggle_json_too_large_is_refused_without_its_content(tmp_path: Path) -> None:
    path = tmp_path / "kaggle.json"
    path.write_text(json.dumps({"username": "u", "key": "SECRET-VALUE-42", "pad": " " * 70_000}))
    with pytest.raises(KaggleError) as err:
        _read_kaggle_json(path)
    assert str(err.value).startswith(f"{path} is not a valid kaggle.json")
    assert "SECRET" not in str(err.value) + repr(err.value)


# -- the key stays secret; progress ---------------------------------------------------------
@pytest.fixture
def every_log() -> Iterator[io.StringIO]:
    """All log records of kagglehub, requests and urllib3 (DEBUG up), as text."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    loggers = [logging.getLogger(name) for name in ("kagglehub", "urllib3", "requests", "")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield buffer
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def test_the_key_never_shows(env_user: KaggleServer, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str],
                             caplog: pytest.LogCaptureFixture, every_log: io.StringIO) -> None:
    caplog.set_level(logging.DEBUG)
    env_user.add_dataset("alice/iris", make_zip(FILES))
    env_user.add_competition("titanic", make_zip({"t.csv": b"x"}))
    res = kaggle_download("alice/iris", tmp_path / "iris", progress=True)
    shown = [repr(res), str(res), res.summary()]
    for call in (lambda: kaggle_download("titanic", tmp_path / "t", competition=True),
                 lambda: kaggle_download("alice/nope", tmp_path / "n")):
        with pytest.raises(KaggleError) as err:
            call()
        shown += [str(err.value), repr(err.value)]
    out = capsys.readouterr()
    text = "\n".join([*shown, out.out, out.err, caplog.text, every_log.getvalue()])
    assert "alice/iris" in every_log.getvalue() or "Extracting" in every_log.getvalue()
    assert KEY not in text and TOKEN not in text and TOKEN.rstrip("=") not in text


def test_library_error_text_is_scrubbed_to_one_line(tmp_path: Path) -> None:
    """Whatever kagglehub or requests put in an error, the key and its token go."""
    job = _Job(_Handle("alice/iris", "iris", "alice"), tmp_path / "iris",
               KaggleAuth("KAGGLE_USERNAME/KAGGLE_KEY", _secrets(USER, KEY)), False, False)
    raw = ValueError(f"GET http://localhost/x?key={KEY} failed\nAuthorization: Basic {TOKEN}")
    message = str(job.translate(raw))
    assert message == ("downloading dataset alice/iris failed: GET http://localhost/x?key=*** "
                       "failed Authorization: Basic ***")
    assert USER + ":" not in repr(job.auth) and KEY not in repr(job.auth)


def test_progress_false_hides_kagglehubs_bar(env_user: KaggleServer, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    env_user.add_dataset("alice/iris", make_zip(FILES))
    kaggle_download("alice/iris", tmp_path / "quiet", progress=False)
    assert "%|" not in capsys.readouterr().err
    kaggle_download("alice/iris", tmp_path / "loud", progress=True)
    assert "100%|" in capsys.readouterr().err


def test_result_summary_is_one_line(tmp_path: Path) -> None:
    res = KaggleResult(tmp_path, "alice/iris", 2, 2048, False, 3)
    assert res.summary() == f"Kaggle alice/iris (version 3): 2 files, 2.0 KiB in {tmp_path} " \
                            "(downloaded)"
    assert str(res) == res.summary()

    class Printer:
        text_seen = ""

        def text(self, value: str) -> None:
            self.text_seen = value

    printer = Printer()
    res._repr_pretty_(printer, False)
    assert printer.text_seen == res.summary()
