"""Google Drive downloads: gdown's real code against a fake Drive on 127.0.0.1.

Nothing is mocked: ``gdrive_server`` (see tests/gdrive_server.py) is an HTTPS proxy on the
loopback that requests reaches through ``HTTPS_PROXY``; it terminates TLS for
drive.google.com and friends with a throwaway CA given in ``REQUESTS_CA_BUNDLE`` and answers
the requests gdown really makes. Its log is what the assertions read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fifo_reader import read_with_fifo_at
from gdrive_server import FakeDrive
from IPython.lib.pretty import pretty

from ipycloud.runtime.machine.platform import detect_platform
from ipycloud.runtime.storage.gdrive import (
    STAGING,
    GdriveError,
    GdriveResult,
    drive_id,
    gdrive_download,
)
from ipycloud.runtime.storage.mount import mount

ID = "1AbCdEfGhIjKlMnOpQrStUvWxYz012345"  # 33 characters, like Drive's
DATA = bytes(range(256)) * 8000  # 2 MB: several of gdown's 512 KiB chunks
SHA = hashlib.sha256(DATA).hexdigest()
MD5 = hashlib.md5(DATA).hexdigest()


def _gets(drive: FakeDrive) -> list[tuple[str, str, dict[str, str], str | None, int]]:
    return [(r.host, r.path, r.query, r.range, r.status) for r in drive.requests]


def _leftovers(folder: Path) -> list[str]:
    """Names in the staging area other than markers and the lock."""
    staging = folder / STAGING
    return sorted(str(p.relative_to(staging)) for p in staging.rglob("*")
                  if p.is_file() and p.suffix != ".json" and p.name != ".ipycloud.lock")


# -- parsing ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("link", "kind"), [
    (ID, "file"),
    (f"  {ID}\n", "file"),
    (f"https://drive.google.com/file/d/{ID}/view?usp=sharing", "file"),
    (f"https://drive.google.com/file/d/{ID}/view", "file"),
    (f"https://drive.google.com/file/d/{ID}", "file"),
    (f"https://drive.google.com/file/d/{ID}/edit#heading", "file"),
    (f"https://drive.google.com/file/u/1/d/{ID}/preview", "file"),
    (f"drive.google.com/file/d/{ID}/view", "file"),
    (f"http://drive.google.com/open?id={ID}", "file"),
    (f"https://drive.google.com/uc?id={ID}&export=download", "file"),
    (f"https://drive.google.com/uc?export=download&id={ID}", "file"),
    (f"https://docs.google.com/uc?id={ID}", "file"),
    (f"https://drive.usercontent.google.com/download?id={ID}&export=download", "file"),
    (f"https://DRIVE.google.com/drive/folders/{ID}", "folder"),
    (f"https://drive.google.com/drive/folders/{ID}/", "folder"),
    (f"https://drive.google.com/drive/u/0/folders/{ID}?usp=sharing", "folder"),
    (f"https://drive.google.com/drive/mobile/folders/{ID}", "folder"),
    (f"https://drive.google.com/embeddedfolderview?id={ID}", "folder"),
])
def test_drive_id_parses_ids_and_share_links(link: str, kind: str) -> None:
    assert drive_id(link) == (kind, ID)


@pytest.mark.parametrize(("link", "message"), [
    ("", "empty"),
    ("   ", "empty"),
    ("abc123", "invalid Google Drive ID"),  # too short
    (ID[:24], "invalid Google Drive ID"),
    (ID[:-1] + "!", "invalid Google Drive ID"),
    (ID[:-1] + "é", "invalid Google Drive ID"),
    (f"https://drive.google.com/file/d/{ID[:10]}/view", "invalid Google Drive ID"),
    (f"https://drive.google.com/file/d/{ID}.x/view", "invalid Google Drive ID"),
    (f"https://example.com/file/d/{ID}/view", "not a Google Drive link"),
    (f"https://drive.google.com.evil.net/file/d/{ID}/view", "not a Google Drive link"),
    (f"ftp://drive.google.com/file/d/{ID}/view", "not a Google Drive link"),
    ("https://drive.google.com/file/d//view", "no Google Drive file or folder ID"),
    ("https://drive.google.com/uc?export=download", "no Google Drive file or folder ID"),
    (f"https://drive.google.com/uc?id={ID}&id={ID}", "no Google Drive file or folder ID"),
    (f"https://drive.google.com/drive/my-drive?id={ID}", "no Google Drive file or folder ID"),
    ("https://drive.google.com/drive/folders/", "no Google Drive file or folder ID"),
    ("https://[::1/x", "malformed"),
])
def test_malformed_ids_and_links_are_value_errors_without_a_request(
    gdrive_server: FakeDrive, tmp_path: Path, link: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as err:
        drive_id(link)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=message):
        gdrive_download(link, tmp_path, progress=False)
    assert gdrive_server.log == []
    assert not (tmp_path / STAGING).exists()


def test_bad_arguments_are_value_errors_without_a_request(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    folder = f"https://drive.google.com/drive/folders/{ID}"
    for kwargs, message in [({"sha256": "abc"}, "sha256 must be 64 hex digits"),
                            ({"md5": "z" * 32}, "md5 must be 32 hex digits"),
                            ({"filename": "../x"}, "unsafe file name"),
                            ({"retries": -1}, "retries")]:
        with pytest.raises(ValueError, match=message):
            gdrive_download(ID, tmp_path, progress=False, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="folder"):
        gdrive_download(folder, tmp_path, sha256=SHA, progress=False)
    assert gdrive_server.log == []


# -- files -----------------------------------------------------------------------------------
def test_small_file_is_downloaded_verified_and_named_by_drive(
    gdrive_server: FakeDrive, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = gdrive_server.add_file("weights v1.bin", b"hello drive")
    res = gdrive_download(f"https://drive.google.com/file/d/{f.id}/view?usp=sharing",
                          tmp_path, sha256=hashlib.sha256(b"hello drive").hexdigest(),
                          md5=hashlib.md5(b"hello drive").hexdigest(), progress=False)
    assert res == GdriveResult(tmp_path / "weights v1.bin", "file", f.id, 1, 11,
                               hashlib.sha256(b"hello drive").hexdigest(), False)
    assert res.path.read_bytes() == b"hello drive"
    assert _gets(gdrive_server) == [
        ("drive.google.com", "/uc", {"id": f.id}, None, 303),
        ("drive.usercontent.google.com", "/download", {"id": f.id, "export": "download"},
         None, 200)]
    assert _leftovers(tmp_path) == []
    assert capsys.readouterr() == ("", "")  # progress=False: gdown stays quiet
    assert str(res) == res.summary() == pretty(res)
    assert res.summary().startswith(f"Drive file {f.id} downloaded: {res.path} (11 B")


def test_filename_renames_and_progress_shows_gdowns_bar(
    gdrive_server: FakeDrive, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = gdrive_server.add_file("x.bin", DATA)
    res = gdrive_download(f.id, tmp_path, filename="model.pt", progress=True)
    assert res.path == tmp_path / "model.pt" and res.path.read_bytes() == DATA
    assert not (tmp_path / "x.bin").exists()
    err = capsys.readouterr().err
    assert "Downloading..." in err and "100%" in err


def test_large_file_goes_through_the_virus_scan_confirmation(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    f = gdrive_server.add_file("big.bin", DATA, virus_scan=True)
    res = gdrive_download(f.id, tmp_path, sha256=SHA, progress=False)
    assert res.path.read_bytes() == DATA and (res.size, res.sha256) == (len(DATA), SHA)
    confirmed = {"id": f.id, "export": "download", "confirm": "t", "uuid": f.uuid}
    assert _gets(gdrive_server) == [
        ("drive.google.com", "/uc", {"id": f.id}, None, 303),
        ("drive.usercontent.google.com", "/download", {"id": f.id, "export": "download"},
         None, 200),  # the warning page and its #download-form
        ("drive.usercontent.google.com", "/download", confirmed, None, 200)]
    assert gdrive_server.requests[-1].sent == len(DATA)


def test_a_dropped_connection_resumes_with_a_range_request(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    f = gdrive_server.add_file("big.bin", DATA, virus_scan=True, drop_after=700_000)
    res = gdrive_download(f.id, tmp_path, sha256=SHA, progress=False)
    assert res.path.read_bytes() == DATA
    first, again = gdrive_server.requests[-2:]
    assert (first.range, first.status, first.sent) == (None, 200, 700_000)
    start = int(again.range.removeprefix("bytes=").removesuffix("-"))  # type: ignore[union-attr]
    assert 0 < start <= 700_000  # gdown keeps whole chunks it received
    assert (again.range, again.if_range, again.status) == (f"bytes={start}-", f.etag, 206)
    assert again.sent == len(DATA) - start
    assert _leftovers(tmp_path) == []


def test_an_interrupted_download_keeps_its_part_and_the_next_call_resumes_it(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    f = gdrive_server.add_file("big.bin", DATA, virus_scan=True, drop_after=1_200_000)
    with pytest.raises(GdriveError, match=r"stopped early.*rerun to resume") as err:
        gdrive_download(f.id, tmp_path, sha256=SHA, retries=0, progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "big.bin").exists()
    [part] = (tmp_path / STAGING / f.id).glob("big.bin*.part")
    kept = part.stat().st_size
    assert 0 < kept <= 1_200_000 and DATA.startswith(part.read_bytes())
    gdrive_server.clear()

    res = gdrive_download(f.id, tmp_path, sha256=SHA, retries=0, progress=False)
    assert res.path.read_bytes() == DATA
    last = gdrive_server.requests[-1]
    assert (last.range, last.if_range, last.status) == (f"bytes={kept}-", f.etag, 206)
    assert last.sent == len(DATA) - kept
    assert _leftovers(tmp_path) == []


def test_a_wrong_checksum_leaves_no_file_and_deletes_the_download(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    f = gdrive_server.add_file("w.bin", DATA, corrupt=True)
    with pytest.raises(GdriveError, match=r"checksum mismatch for w\.bin") as err:
        gdrive_download(f.id, tmp_path, sha256=SHA, progress=False)
    assert "\n" not in str(err.value) and f"sha256 expected {SHA}" in str(err.value)
    assert not (tmp_path / "w.bin").exists()
    assert _leftovers(tmp_path) == []
    with pytest.raises(GdriveError, match="md5 expected"):
        gdrive_download(f.id, tmp_path, md5=MD5.upper(), progress=False)
    assert not (tmp_path / "w.bin").exists()


def test_a_second_call_is_skipped_without_a_request(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    f = gdrive_server.add_file("d.bin", DATA)
    first = gdrive_download(f.id, tmp_path, progress=False)
    assert json.loads((tmp_path / STAGING / f"{f.id}.json").read_text())["name"] == "d.bin"
    gdrive_server.clear()
    for kwargs in ({}, {"sha256": SHA}, {"md5": MD5}, {"filename": "d.bin"}):
        again = gdrive_download(f"https://drive.google.com/open?id={f.id}", tmp_path,
                                progress=False, **kwargs)  # type: ignore[arg-type]
        assert again == GdriveResult(first.path, "file", f.id, 1, len(DATA), SHA, True)
        assert "already present" in again.summary()
    assert gdrive_server.log == []


def test_a_fifo_in_place_of_the_marker_downloads_again_without_a_hang(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    f = gdrive_server.add_file("d.bin", DATA)
    gdrive_download(f.id, tmp_path, progress=False)
    marker = tmp_path / STAGING / f"{f.id}.json"
    marker.unlink()
    gdrive_server.clear()
    again = read_with_fifo_at(marker, lambda: gdrive_download(f.id, tmp_path, progress=False))
    assert not again.skipped and again.path.read_bytes() == DATA
    assert json.loads(marker.read_text())["name"] == "d.bin"


def test_a_present_file_under_the_given_name_is_skipped(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    (tmp_path / "mine.bin").write_bytes(b"local copy")
    res = gdrive_download(ID, tmp_path, filename="mine.bin", progress=False)
    assert res.skipped and res.path.read_bytes() == b"local copy"
    assert gdrive_server.log == []


def test_a_file_that_no_longer_matches_is_downloaded_again(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    f = gdrive_server.add_file("d.bin", DATA)
    gdrive_download(f.id, tmp_path, progress=False)
    (tmp_path / "d.bin").write_bytes(b"truncated")
    gdrive_server.clear()
    res = gdrive_download(f.id, tmp_path, sha256=SHA, progress=False)
    assert not res.skipped and res.path.read_bytes() == DATA
    assert [r.path for r in gdrive_server.requests] == ["/uc", "/download"]


def test_force_downloads_again(gdrive_server: FakeDrive, tmp_path: Path) -> None:
    f = gdrive_server.add_file("d.bin", DATA)
    gdrive_download(f.id, tmp_path, sha256=SHA, progress=False)
    gdrive_server.clear()
    res = gdrive_download(f.id, tmp_path, sha256=SHA, force=True, progress=False)
    assert not res.skipped and res.path.read_bytes() == DATA
    assert [(r.path, r.status) for r in gdrive_server.requests] == [("/uc", 303),
                                                                    ("/download", 200)]


def test_default_destination_is_the_mounted_projects_data_folder(
    gdrive_server: FakeDrive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = gdrive_server.add_file("d.bin", b"data")
    monkeypatch.chdir(tmp_path)
    assert gdrive_download(f.id, progress=False).path == tmp_path / "data" / "d.bin"
    platform = detect_platform({"HOME": str(tmp_path / "home")}, tmp_path)
    project = mount(project="p", root=tmp_path / "root", platform=platform).project
    assert gdrive_download(f.id, progress=False).path == project / "data" / "d.bin"


# -- folders ---------------------------------------------------------------------------------
def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_folder_with_nested_files_is_downloaded_then_skipped(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    d = gdrive_server
    deep = d.add_folder("deep", [d.add_file("c.txt", b"ccc").id])
    sub = d.add_folder("sub", [d.add_file("b.bin", DATA, virus_scan=True).id, deep])
    top = d.add_folder("Dataset", [d.add_file("a.txt", b"aa").id, sub])
    link = f"https://drive.google.com/drive/u/0/folders/{top}?usp=sharing"
    res = gdrive_download(link, tmp_path, progress=False)
    assert res == GdriveResult(tmp_path / "Dataset", "folder", top, 3, 5 + len(DATA), None,
                               False)
    assert _tree(res.path) == {"a.txt": b"aa", "sub/b.bin": DATA, "sub/deep/c.txt": b"ccc"}
    listings = [r.query["id"] for r in d.requests if r.path == "/embeddedfolderview"]
    assert listings == [top, sub, deep]
    assert _leftovers(tmp_path) == []
    assert res.summary().startswith(f"Drive folder {top} downloaded: {res.path} (3 files")

    d.clear()
    again = gdrive_download(link, tmp_path, progress=False)
    assert again == GdriveResult(res.path, "folder", top, 3, 5 + len(DATA), None, True)
    assert d.log == []

    (res.path / "a.txt").write_bytes(b"changed")
    renamed = gdrive_download(link, tmp_path, force=True, progress=False)
    assert not renamed.skipped and _tree(renamed.path)["a.txt"] == b"aa"
    assert len([r for r in d.requests if r.path == "/embeddedfolderview"]) == 3


def test_folder_does_not_replace_a_folder_it_did_not_download(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    top = gdrive_server.add_folder("Mine", [gdrive_server.add_file("a.txt", b"aa").id])
    (tmp_path / "Mine").mkdir()
    (tmp_path / "Mine" / "notes.txt").write_text("keep")
    link = f"https://drive.google.com/drive/folders/{top}"
    with pytest.raises(GdriveError, match=r"already exists.*force=True"):
        gdrive_download(link, tmp_path, progress=False)
    assert _tree(tmp_path / "Mine") == {"notes.txt": b"keep"}
    res = gdrive_download(link, tmp_path, filename="Theirs", progress=False)
    assert _tree(res.path) == {"a.txt": b"aa"}


def test_a_forced_folder_that_cannot_be_moved_into_place_keeps_the_old_copy(
    gdrive_server: FakeDrive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = gdrive_server.add_folder("Dataset", [gdrive_server.add_file("a.txt", b"aa").id])
    link = f"https://drive.google.com/drive/folders/{top}"
    first = gdrive_download(link, tmp_path, progress=False)
    (first.path / "mine.txt").write_text("keep")
    staged = tmp_path / STAGING / f"{top}.folder" / "Dataset"

    def refusing(move: Callable[[str, str], None]) -> Callable[[str, str], None]:
        def move_unless_staged(source: str, target: str) -> None:
            if Path(source) == staged:
                raise OSError(errno.EIO, "Input/output error")
            move(source, target)
        return move_unless_staged

    monkeypatch.setattr(os, "rename", refusing(os.rename))
    monkeypatch.setattr(os, "replace", refusing(os.replace))
    with pytest.raises(OSError, match="Input/output error"):
        gdrive_download(link, tmp_path, force=True, progress=False)
    assert _tree(first.path) == {"a.txt": b"aa", "mine.txt": b"keep"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [STAGING, "Dataset"]


# -- failures --------------------------------------------------------------------------------
def _one_line_error(link: str, dest: Path, match: str) -> str:
    with pytest.raises(GdriveError, match=match) as err:
        gdrive_download(link, dest, progress=False, retries=0)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_file_that_is_not_shared_says_how_to_share_it(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    f = gdrive_server.add_file("secret.bin", DATA, access="private")
    _one_line_error(f.id, tmp_path, f"cannot access Drive file {f.id}.*'Anyone with the link'")
    assert ("accounts.google.com", "/ServiceLogin") in [(r.host, r.path)
                                                        for r in gdrive_server.requests]
    assert not (tmp_path / "secret.bin").exists() and _leftovers(tmp_path) == []


def test_a_folder_that_is_not_shared_says_how_to_share_it(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    top = gdrive_server.add_folder("Private", [], access="private")
    _one_line_error(f"https://drive.google.com/drive/folders/{top}", tmp_path,
                    "lists no files: if it is not empty, share it as 'Anyone with the link'")
    assert list(tmp_path.iterdir()) == [tmp_path / STAGING]
    assert _leftovers(tmp_path) == []


def test_quota_exceeded_says_to_wait(gdrive_server: FakeDrive, tmp_path: Path) -> None:
    f = gdrive_server.add_file("popular.bin", DATA, access="quota")
    _one_line_error(f.id, tmp_path, "quota exceeded.*try again in up to 24 h")
    assert not (tmp_path / "popular.bin").exists()


def test_unknown_file_and_folder_are_not_found(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    _one_line_error(ID, tmp_path, f"Drive file {ID} not found \\(HTTP 404\\): check the ID")
    _one_line_error(f"https://drive.google.com/drive/folders/{ID}", tmp_path,
                    f"Drive folder {ID} not found")
    assert [(r.path, r.status) for r in gdrive_server.requests] == [
        ("/uc", 404), ("/embeddedfolderview", 404)]


def test_a_file_failing_inside_a_folder_fails_the_folder(
    gdrive_server: FakeDrive, tmp_path: Path
) -> None:
    d = gdrive_server
    top = d.add_folder("Mixed", [d.add_file("ok.txt", b"ok").id,
                                 d.add_file("no.bin", DATA, access="private").id])
    _one_line_error(f"https://drive.google.com/drive/folders/{top}", tmp_path,
                    "1 file failed to download; rerun to resume")
    assert not (tmp_path / "Mixed").exists()


def test_connection_refused_is_a_gdrive_error(
    gdrive_server: FakeDrive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    for name in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
    _one_line_error(ID, tmp_path, "cannot reach Google Drive.*Connection refused")
    assert not any(p.is_file() for p in tmp_path.rglob("*") if p.suffix != ".lock")


def test_gdown_missing_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gdown", None)
    with pytest.raises(ImportError, match=r"pip install 'ipycloud\[drive\]'"):
        gdrive_download(ID, tmp_path, progress=False)


def test_importing_the_module_does_not_import_gdown() -> None:
    code = ("import sys, ipycloud.runtime.storage.gdrive as g; "
            "g.drive_id('https://drive.google.com/drive/folders/" + ID + "'); "
            "assert 'gdown' not in sys.modules and 'requests' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
