"""Verified, resumable download against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import BinaryIO

import pytest
from http_server import LoopbackServer, Served

from ipycloud.runtime.storage import download as dl
from ipycloud.runtime.storage.download import DownloadError, download

DATA = bytes(range(256)) * 1200  # 307200 bytes, several chunks
SHA = hashlib.sha256(DATA).hexdigest()
MD5 = hashlib.md5(DATA).hexdigest()


def _gets(server: LoopbackServer) -> list[tuple[str | None, int, int]]:
    return [(r.range, r.status, r.sent) for r in server.requests if r.method == "GET"]


def test_full_download_verifies_sha256_and_md5(http_server: LoopbackServer, tmp_path: Path) -> None:
    http_server.add("w.bin", DATA)
    res = download(http_server.url("w.bin"), tmp_path, sha256=SHA, md5=MD5, progress=False)
    assert res.path == tmp_path / "w.bin"
    assert res.path.read_bytes() == DATA
    assert (res.size, res.sha256, res.resumed_from, res.skipped) == (len(DATA), SHA, 0, False)
    assert not (tmp_path / "w.bin.part").exists()


def test_name_from_content_disposition(http_server: LoopbackServer, tmp_path: Path) -> None:
    http_server.add("get", DATA, disposition='attachment; filename="model.pt"')
    res = download(http_server.url("get"), tmp_path, progress=False)
    assert res.path == tmp_path / "model.pt"
    assert res.path.read_bytes() == DATA


def test_dropped_connection_resumes_without_refetching(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    http_server.add("d.bin", DATA, drop_after=100_000)
    res = download(http_server.url("d.bin"), tmp_path, sha256=SHA, progress=False)
    assert res.path.read_bytes() == DATA
    assert res.resumed_from == 100_000
    gets = _gets(http_server)
    assert gets == [(None, 200, 100_000), ("bytes=100000-", 206, len(DATA) - 100_000)]
    assert sum(sent for _, _, sent in gets) == len(DATA)


def test_always_dropping_gives_up_with_resume_hint(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    http_server.add("d.bin", DATA, drop_after=50_000, drop_always=True, etag="strong")
    with pytest.raises(DownloadError) as err:
        download(http_server.url("d.bin"), tmp_path, retries=2, progress=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"fetched 150000 of {len(DATA)} bytes" in msg and "resume" in msg
    assert (tmp_path / "d.bin.part").stat().st_size == 150_000
    assert not (tmp_path / "d.bin").exists()


def test_always_dropping_without_validators_says_how_to_resume(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    http_server.add("d.bin", DATA, drop_after=50_000, drop_always=True)
    with pytest.raises(DownloadError) as err:
        download(http_server.url("d.bin"), tmp_path, retries=2, progress=False)
    msg = str(err.value)
    assert f"fetched 50000 of {len(DATA)} bytes" in msg  # each retry started over
    assert "no ETag or Last-Modified" in msg and "SHA-256 to resume" in msg and "\n" not in msg
    assert [get[0] for get in _gets(http_server)] == [None, None, None]


def test_existing_part_is_resumed(http_server: LoopbackServer, tmp_path: Path) -> None:
    http_server.add("p.bin", DATA)
    (tmp_path / "p.bin.part").write_bytes(DATA[:123_456])
    res = download(http_server.url("p.bin"), tmp_path, sha256=SHA, progress=False)
    assert res.path.read_bytes() == DATA
    assert res.resumed_from == 123_456
    assert _gets(http_server) == [("bytes=123456-", 206, len(DATA) - 123_456)]


def test_part_with_content_disposition_name_is_resumed(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    http_server.add("get", DATA, disposition="attachment; filename=m.pt")
    (tmp_path / "m.pt.part").write_bytes(DATA[:1000])
    res = download(http_server.url("get"), tmp_path, sha256=SHA, progress=False)
    assert res.path == tmp_path / "m.pt" and res.resumed_from == 1000
    # The first GET learns the name and is dropped; it may finish (and be logged) last.
    gets = sorted(_gets(http_server), key=lambda get: get[0] or "")
    assert [get[0] for get in gets] == [None, "bytes=1000-"]
    assert gets[1][1:] == (206, len(DATA) - 1000)


def test_server_ignoring_range_restarts_cleanly(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    http_server.add("r.bin", DATA, ignore_range=True)
    (tmp_path / "r.bin.part").write_bytes(b"x" * 5000)  # would corrupt if appended to
    res = download(http_server.url("r.bin"), tmp_path, sha256=SHA, progress=False)
    assert res.path.read_bytes() == DATA
    assert res.resumed_from == 0 and res.sha256 == SHA
    assert _gets(http_server) == [("bytes=5000-", 200, len(DATA))]


def test_complete_part_answered_416_is_verified(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    http_server.add("c.bin", DATA)
    (tmp_path / "c.bin.part").write_bytes(DATA)
    res = download(http_server.url("c.bin"), tmp_path, sha256=SHA, progress=False)
    assert res.path.read_bytes() == DATA and res.resumed_from == len(DATA)
    assert _gets(http_server) == [(f"bytes={len(DATA)}-", 416, 0)]


@pytest.mark.parametrize("kind", ["sha256", "md5"])
def test_wrong_checksum_leaves_nothing(
    http_server: LoopbackServer, tmp_path: Path, kind: str
) -> None:
    http_server.add("bad.bin", DATA, corrupt=True)
    expected = {"sha256": SHA} if kind == "sha256" else {"md5": MD5}
    with pytest.raises(DownloadError, match="checksum mismatch") as err:
        download(http_server.url("bad.bin"), tmp_path, progress=False, **expected)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_wrong_size_leaves_nothing(http_server: LoopbackServer, tmp_path: Path) -> None:
    http_server.add("s.bin", DATA)
    with pytest.raises(DownloadError, match="size mismatch"):
        download(http_server.url("s.bin"), tmp_path, size=len(DATA) + 1, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_404_is_one_line(http_server: LoopbackServer, tmp_path: Path) -> None:
    with pytest.raises(DownloadError) as err:
        download(http_server.url("missing.bin"), tmp_path, progress=False)
    msg = str(err.value)
    assert "HTTP 404 Not Found" in msg and "\n" not in msg
    assert list(tmp_path.iterdir()) == []


def test_503_is_retried_then_reported(http_server: LoopbackServer, tmp_path: Path) -> None:
    http_server.add("busy.bin", DATA, status=503)
    with pytest.raises(DownloadError, match="HTTP 503 Service Unavailable"):
        download(http_server.url("busy.bin"), tmp_path, retries=1, progress=False)
    assert len(_gets(http_server)) == 2


@pytest.mark.parametrize("given", [{"sha256": SHA}, {"md5": MD5}, {"size": len(DATA)}])
def test_present_and_valid_is_skipped_without_request(
    http_server: LoopbackServer, tmp_path: Path, given: dict[str, object]
) -> None:
    http_server.add("k.bin", DATA)
    (tmp_path / "k.bin").write_bytes(DATA)
    res = download(http_server.url("k.bin"), tmp_path, progress=False, **given)  # type: ignore[arg-type]
    assert res.skipped and res.sha256 == SHA and res.size == len(DATA)
    assert http_server.requests == []


def test_present_but_wrong_is_replaced(http_server: LoopbackServer, tmp_path: Path) -> None:
    http_server.add("k.bin", DATA)
    (tmp_path / "k.bin").write_bytes(b"stale")
    res = download(http_server.url("k.bin"), tmp_path, sha256=SHA, progress=False)
    assert not res.skipped and res.path.read_bytes() == DATA


def test_full_disk_refused_before_writing(
    http_server: LoopbackServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulates a full disk: disk_usage reports only 1000 bytes free in the folder.
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: real(p)._replace(free=1000))
    http_server.add("big.bin", DATA)
    with pytest.raises(DownloadError, match="not enough free space"):
        download(http_server.url("big.bin"), tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", [
    "ftp://127.0.0.1/x", "http:///x", "127.0.0.1/x", "http://127.0.0.1:99999/x",
    "http://[::1/x", "http://127.0.0.1/a b", "",
])
def test_malformed_urls(url: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError) as err:
        download(url, tmp_path, progress=False)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["../evil", "..", "a/b", "a\\b", ".", ""])
def test_bad_filenames(name: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsafe file name"):
        download("http://127.0.0.1:1/x", tmp_path, filename=name, progress=False)


def test_unsafe_content_disposition_refused(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    http_server.add("get", DATA, disposition='attachment; filename="../../etc/passwd"')
    with pytest.raises(DownloadError, match="unsafe file name"):
        download(http_server.url("get"), tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_keyboard_interrupt_leaves_part_and_rerun_completes(
    http_server: LoopbackServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    http_server.add("i.bin", DATA)
    real = dl._write_chunk
    calls = []

    def interrupting(fh: BinaryIO, data: bytes) -> None:
        calls.append(len(data))
        if len(calls) > 1:
            raise KeyboardInterrupt
        real(fh, data)

    monkeypatch.setattr(dl, "_write_chunk", interrupting)
    with pytest.raises(KeyboardInterrupt):
        download(http_server.url("i.bin"), tmp_path, sha256=SHA, progress=False)
    part = tmp_path / "i.bin.part"
    assert part.stat().st_size == calls[0] > 0
    assert not (tmp_path / "i.bin").exists()

    monkeypatch.setattr(dl, "_write_chunk", real)
    res = download(http_server.url("i.bin"), tmp_path, sha256=SHA, progress=False)
    assert res.resumed_from == calls[0] and res.path.read_bytes() == DATA
    assert not part.exists()


def test_credentials_never_in_messages(http_server: LoopbackServer, tmp_path: Path) -> None:
    url = f"http://user:secret@127.0.0.1:{http_server.port}/missing.bin?token=abc"
    with pytest.raises(DownloadError) as err:
        download(url, tmp_path, progress=False)
    msg = str(err.value)
    assert "HTTP 404" in msg and "127.0.0.1" in msg
    for leak in ("secret", "token", "abc", "user"):
        assert leak not in msg
    sent = http_server.requests[0].headers
    assert sent.get("Authorization", "").startswith("Basic ")

    with pytest.raises(ValueError) as bad:
        download("ftp://user:secret@127.0.0.1/x?token=abc", tmp_path, progress=False)
    assert "secret" not in str(bad.value) and "abc" not in str(bad.value)


def test_a_password_holding_the_user_name_is_scrubbed_whole(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    url = f"http://alice:alice-s3cret@127.0.0.1:{http_server.port}/alice-s3cret/missing.bin"
    with pytest.raises(DownloadError) as err:
        download(url, tmp_path, progress=False)
    msg = str(err.value)
    assert "HTTP 404" in msg and "/***/missing.bin" in msg
    assert "s3cret" not in msg and "alice" not in msg


def test_progress_bar_runs(http_server: LoopbackServer, tmp_path: Path) -> None:
    http_server.add("b.bin", DATA)
    res = download(http_server.url("b.bin"), os.fspath(tmp_path), progress=True)
    assert res.path.read_bytes() == DATA


def test_default_dest_is_cwd(
    http_server: LoopbackServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    http_server.add("cwd.bin", DATA)
    res = download(http_server.url("cwd.bin"), progress=False)
    assert res.path == tmp_path / "cwd.bin" and res.path.read_bytes() == DATA


# -- resuming only the same file ------------------------------------------------------------

NEW = bytes(reversed(DATA))  # the file as changed on the server: same size, other bytes
NEW_SHA = hashlib.sha256(NEW).hexdigest()


def _interrupted(server: LoopbackServer, folder: Path, name: str, **faults: object) -> Served:
    """Serve DATA at ``name``, cut after 100,000 bytes; download until the cut, no retry."""
    served = server.add(name, DATA, drop_after=100_000, **faults)
    with pytest.raises(DownloadError, match="failed after 1 attempt "):
        download(server.url(name), folder, retries=0, progress=False)
    assert (folder / f"{name}.part").stat().st_size == 100_000
    return served


def test_a_file_changed_without_validators_is_fetched_again_whole(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    served = _interrupted(http_server, tmp_path, "c.bin")
    served.change(NEW)
    res = download(http_server.url("c.bin"), tmp_path, progress=False)
    assert res.path.read_bytes() == NEW and res.resumed_from == 0
    assert _gets(http_server)[-1] == (None, 200, len(NEW))


def test_a_file_changed_during_the_retries_is_not_spliced(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    http_server.add("c.bin", DATA, drop_after=100_000, then=NEW)
    res = download(http_server.url("c.bin"), tmp_path, progress=False)
    assert res.path.read_bytes() == NEW and res.resumed_from == 0
    assert _gets(http_server) == [(None, 200, 100_000), (None, 200, len(NEW))]


@pytest.mark.parametrize("validator", [{"etag": "strong"}, {"last_modified": True},
                                       {"etag": "strong", "last_modified": True}])
def test_the_same_file_is_resumed_with_if_range(
    http_server: LoopbackServer, tmp_path: Path, validator: dict[str, object]
) -> None:
    served = _interrupted(http_server, tmp_path, "v.bin", **validator)
    res = download(http_server.url("v.bin"), tmp_path, progress=False)
    assert res.path.read_bytes() == DATA and res.resumed_from == 100_000
    first, second = [r for r in http_server.requests if r.method == "GET"]
    sent = served.validators()
    assert second.headers["If-Range"] == sent.get("ETag", sent.get("Last-Modified"))
    assert (second.range, second.status) == ("bytes=100000-", 206)
    assert "If-Range" not in first.headers
    assert not (tmp_path / "v.bin.part").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.bin"]


@pytest.mark.parametrize("validator", [{"etag": "strong"}, {"last_modified": True}])
def test_a_changed_file_answered_200_to_if_range_starts_over(
    http_server: LoopbackServer, tmp_path: Path, validator: dict[str, object]
) -> None:
    served = _interrupted(http_server, tmp_path, "v.bin", **validator)
    served.change(NEW)
    res = download(http_server.url("v.bin"), tmp_path, progress=False)
    assert res.path.read_bytes() == NEW and res.resumed_from == 0
    assert _gets(http_server)[-1] == ("bytes=100000-", 200, len(NEW))


def test_a_weak_etag_is_no_proof(http_server: LoopbackServer, tmp_path: Path) -> None:
    _interrupted(http_server, tmp_path, "w.bin", etag="weak")
    res = download(http_server.url("w.bin"), tmp_path, progress=False)
    assert res.path.read_bytes() == DATA and res.resumed_from == 0
    assert "If-Range" not in http_server.requests[-1].headers
    assert _gets(http_server)[-1] == (None, 200, len(DATA))


def test_a_server_ignoring_if_range_is_caught_by_the_new_etag(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    served = _interrupted(http_server, tmp_path, "i.bin", etag="strong", ignore_if_range=True)
    served.change(NEW)
    res = download(http_server.url("i.bin"), tmp_path, progress=False)
    assert res.path.read_bytes() == NEW and res.resumed_from == 0
    assert [(r.range, r.status) for r in http_server.requests[1:]] == [
        ("bytes=100000-", 206), (None, 200)]


def test_a_resume_failing_the_checksum_is_fetched_again_whole(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    served = _interrupted(http_server, tmp_path, "s.bin")
    served.change(NEW)
    res = download(http_server.url("s.bin"), tmp_path, sha256=NEW_SHA, progress=False)
    assert res.path.read_bytes() == NEW and res.resumed_from == 0
    assert _gets(http_server)[1:] == [("bytes=100000-", 206, len(NEW) - 100_000),
                                      (None, 200, len(NEW))]


# -- nothing written through a planted part ---------------------------------------------------

@pytest.mark.parametrize("suffix", [".part", ".part.meta"])
def test_a_planted_symlink_is_removed_not_followed(
    http_server: LoopbackServer, tmp_path: Path, suffix: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"precious")
    folder = tmp_path / "dl"
    folder.mkdir()
    (folder / f"l.bin{suffix}").symlink_to(victim)
    (folder / "m.bin.part").symlink_to(outside / "created")  # a dangling link
    for name in ("l.bin", "m.bin"):  # a checksum: a part of ours would be resumed
        http_server.add(name, DATA, etag="strong")
        res = download(http_server.url(name), folder, sha256=SHA, progress=False)
        assert res.path.read_bytes() == DATA and res.resumed_from == 0
    assert victim.read_bytes() == b"precious"
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert sorted(p.name for p in folder.iterdir()) == ["l.bin", "m.bin"]


def test_a_planted_hard_link_is_unlinked_not_written(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    folder = tmp_path / "dl"
    folder.mkdir()
    os.link(victim, folder / "h.bin.part")
    http_server.add("h.bin", DATA)
    res = download(http_server.url("h.bin"), folder, sha256=SHA, progress=False)
    assert res.path.read_bytes() == DATA and res.resumed_from == 0
    assert victim.read_bytes() == b"precious" and victim.stat().st_nlink == 1


@pytest.mark.timeout(20)
def test_a_planted_fifo_is_removed(http_server: LoopbackServer, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.bin.part")
    http_server.add("f.bin", DATA)
    res = download(http_server.url("f.bin"), tmp_path, sha256=SHA, progress=False)
    assert res.path.read_bytes() == DATA
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_a_folder_named_like_the_part_is_left_alone(
    http_server: LoopbackServer, tmp_path: Path
) -> None:
    (tmp_path / "d.bin.part").mkdir()
    (tmp_path / "d.bin.part" / "mine.txt").write_bytes(b"mine")
    http_server.add("d.bin", DATA)
    with pytest.raises(DownloadError, match=r"d\.bin\.part is a folder") as err:
        download(http_server.url("d.bin"), tmp_path, progress=False)
    assert "\n" not in str(err.value)
    assert (tmp_path / "d.bin.part" / "mine.txt").read_bytes() == b"mine"
    assert http_server.requests == []
