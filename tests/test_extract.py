"""Safe extraction: real archives built here, extracted into real folders."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import uuid
import zipfile
from pathlib import Path

import pytest

from ipycloud.runtime.storage import extract as ex
from ipycloud.runtime.storage.extract import UnsafeArchiveError, archive_kind, extract

FILES = {"top.txt": b"top\n", "a/b/deep.bin": bytes(range(256)) * 40, "a/mid.txt": b"mid"}


def _tar_add(tf: tarfile.TarFile, name: str, data: bytes = b"", **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    tf.addfile(info, io.BytesIO(data) if data else None)


def _make_tar(path: Path, mode: str = "w", extra: tuple[dict[str, object], ...] = ()) -> Path:
    with tarfile.open(path, mode) as tf:
        _tar_add(tf, "a", type=tarfile.DIRTYPE, mode=0o750)
        for name, data in FILES.items():
            _tar_add(tf, name, data, mode=0o4755 if name == "top.txt" else 0o640)
        for spec in extra:
            _tar_add(tf, **spec)  # type: ignore[arg-type]
    return path


def _make_zip(path: Path, extra: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in FILES.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = ((0o104755 if name == "top.txt" else 0o100640) << 16)
            zf.writestr(info, data)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return path


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _assert_round_trip(target: Path) -> None:
    assert _tree(target) == FILES
    top = (target / "top.txt").stat().st_mode
    assert stat.S_IMODE(top) == 0o755  # setuid dropped
    assert not top & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)
    assert stat.S_IMODE((target / "a/mid.txt").stat().st_mode) == 0o640


def _siblings(tmp_path: Path) -> set[str]:
    return {p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize("mode,kind", [("w", "tar"), ("w:gz", "tar.gz"), ("w:bz2", "tar.bz2"),
                                       ("w:xz", "tar.xz")])
def test_tar_flavours_round_trip(tmp_path: Path, mode: str, kind: str) -> None:
    archive = _make_tar(tmp_path / "data.bin", mode)  # name says nothing: content decides
    assert archive_kind(archive) == kind
    report = extract(archive, tmp_path / "out", progress=False)
    assert report.refused == () and report.extracted == 3
    assert report.target == tmp_path / "out"
    _assert_round_trip(tmp_path / "out")
    assert stat.S_IMODE((tmp_path / "out/a").stat().st_mode) == 0o750
    assert _siblings(tmp_path) == {"data.bin", "out"}


def test_zip_round_trip_with_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = _make_zip(tmp_path / "data.zip")
    assert archive_kind(archive) == "zip"
    report = extract(archive, tmp_path / "out", progress=True)
    assert report.extracted == 3 and report.refused == ()
    _assert_round_trip(tmp_path / "out")
    assert "extract data.zip" in capsys.readouterr().err


def test_quiet_when_progress_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extract(_make_zip(tmp_path / "d.zip", {"../x": b"x"}), tmp_path / "out", progress=False)
    assert capsys.readouterr() == ("", "")


def test_zip_slip_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    archive = _make_zip(tmp_path / "evil.zip", {"../evil": b"x", "a/../../evil2": b"x",
                                                "..\\evil3": b"x", "C:\\evil4": b"x",
                                                "ok/../fine.txt": b"fine"})
    report = extract(archive, work / "out")
    assert {r.split(":")[0] for r in report.refused} == {"../evil", "a/../../evil2",
                                                         "..\\evil3", "C"}
    assert any("drive letter" in r for r in report.refused)
    for name in ("evil", "evil2", "evil3", "C:\\evil4"):
        assert not (work / name).exists() and not (tmp_path / name).exists()
    assert (work / "out/fine.txt").read_bytes() == b"fine"
    assert "refused" in capsys.readouterr().err


def test_absolute_path_refused(tmp_path: Path) -> None:
    aim = tmp_path.parent / f"ipycloud-evil-{uuid.uuid4().hex}"
    archive = tmp_path / "abs.tar"
    with tarfile.open(archive, "w") as tf:
        _tar_add(tf, str(aim), b"pwned")
        _tar_add(tf, "ok.txt", b"ok")
    report = extract(archive, tmp_path / "out", progress=False)
    assert report.refused == (f"{aim}: absolute path",)
    assert not aim.exists()
    assert not (tmp_path / "out" / str(aim).lstrip("/")).exists()
    assert _tree(tmp_path / "out") == {"ok.txt": b"ok"}


def test_symlink_escape_refused(tmp_path: Path) -> None:
    aim = tmp_path / "outside"
    aim.mkdir()
    archive = tmp_path / "link.tar"
    with tarfile.open(archive, "w") as tf:
        _tar_add(tf, "link", type=tarfile.SYMTYPE, linkname="/etc")
        _tar_add(tf, "link/passwd", b"root::0:0")
        _tar_add(tf, "rel", type=tarfile.SYMTYPE, linkname="../outside")
        _tar_add(tf, "rel/planted", b"x")
        _tar_add(tf, "sub/c", type=tarfile.SYMTYPE, linkname="..")  # inside: allowed
        _tar_add(tf, "trick", type=tarfile.SYMTYPE, linkname="sub/c/..")  # really outside
        _tar_add(tf, "data.txt", b"d")
        _tar_add(tf, "good", type=tarfile.SYMTYPE, linkname="data.txt")
    target = tmp_path / "out"
    report = extract(archive, target, progress=False)
    names = sorted(r.split(":")[0] for r in report.refused)
    assert names == ["link", "link/passwd", "rel", "rel/planted", "trick"]
    assert not (aim / "planted").exists() and list(aim.iterdir()) == []
    assert not os.path.lexists(target / "link") and not os.path.lexists(target / "trick")
    assert os.readlink(target / "good") == "data.txt"
    assert (target / "good").read_bytes() == b"d"
    assert os.path.realpath(target / "sub/c") == str(target.resolve())


def test_write_through_inside_symlink_refused(tmp_path: Path) -> None:
    archive = tmp_path / "through.tar"
    with tarfile.open(archive, "w") as tf:
        _tar_add(tf, "real", type=tarfile.DIRTYPE, mode=0o755)
        _tar_add(tf, "alias", type=tarfile.SYMTYPE, linkname="real")
        _tar_add(tf, "alias/f.txt", b"x")
    report = extract(archive, tmp_path / "out", progress=False)
    assert [r.split(":")[0] for r in report.refused] == ["alias/f.txt"]
    assert list((tmp_path / "out/real").iterdir()) == []


def test_hard_links(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"secret")
    archive = tmp_path / "hard.tar"
    with tarfile.open(archive, "w") as tf:
        _tar_add(tf, "steal", type=tarfile.LNKTYPE, linkname=str(secret))
        _tar_add(tf, "steal2", type=tarfile.LNKTYPE, linkname="../secret.txt")
        _tar_add(tf, "f.txt", b"inside")
        _tar_add(tf, "same", type=tarfile.LNKTYPE, linkname="f.txt")
    target = tmp_path / "out"
    report = extract(archive, target, progress=False)
    assert sorted(r.split(":")[0] for r in report.refused) == ["steal", "steal2"]
    assert not (target / "steal").exists() and not (target / "steal2").exists()
    assert secret.stat().st_nlink == 1 and secret.read_bytes() == b"secret"
    assert (target / "same").read_bytes() == b"inside"


@pytest.mark.parametrize("kind,word", [(tarfile.CHRTYPE, "device"), (tarfile.BLKTYPE, "device"),
                                       (tarfile.FIFOTYPE, "FIFO")])
def test_special_members_refused(tmp_path: Path, kind: bytes, word: str) -> None:
    archive = tmp_path / "dev.tar"
    with tarfile.open(archive, "w") as tf:
        _tar_add(tf, "null", type=kind, devmajor=1, devminor=3)
        _tar_add(tf, "ok.txt", b"ok")
    report = extract(archive, tmp_path / "out", progress=False)
    assert len(report.refused) == 1 and report.refused[0].startswith("null:")
    assert word in report.refused[0]
    assert not os.path.lexists(tmp_path / "out/null")
    assert report.extracted == 1


def test_data_filter_not_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = tmp_path / "mix.tar"
    with tarfile.open(archive, "w") as tf:
        _tar_add(tf, "link", type=tarfile.SYMTYPE, linkname="/etc")
        _tar_add(tf, "link/passwd", b"x")
        _tar_add(tf, "../evil", b"x")
        _tar_add(tf, "fifo", type=tarfile.FIFOTYPE)
        _tar_add(tf, "sub/c", type=tarfile.SYMTYPE, linkname="..")
        _tar_add(tf, "trick", type=tarfile.SYMTYPE, linkname="sub/c/..")
        _tar_add(tf, "alias", type=tarfile.SYMTYPE, linkname="sub/c")
        _tar_add(tf, "alias/f.txt", b"x")
    target = tmp_path / "work/out"
    report = extract(archive, target, progress=False)
    assert sorted(r.split(":")[0] for r in report.refused) == [
        "../evil", "alias/f.txt", "fifo", "link", "link/passwd", "trick"]
    assert report.extracted == 2  # sub/c and alias stay: they resolve inside
    assert not (tmp_path / "work/evil").exists()
    assert not os.path.lexists(target / "trick") and not (target / "f.txt").exists()


def test_strict_raises_and_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "top.txt").write_bytes(b"old")
    archive = _make_tar(tmp_path / "s.tar", extra=({"name": "../evil", "data": b"x"},))
    with pytest.raises(UnsafeArchiveError, match="evil") as info:
        extract(archive, target, strict=True, progress=False)
    assert info.value.refused == ("../evil: '..' escapes the target",)
    assert _tree(target) == {"top.txt": b"old"}
    assert not (tmp_path / "evil").exists()
    assert _siblings(tmp_path) == {"out", "s.tar"}


def test_strict_raises_on_late_refusal(tmp_path: Path) -> None:
    archive = tmp_path / "late.tar"
    with tarfile.open(archive, "w") as tf:
        _tar_add(tf, "sub/c", type=tarfile.SYMTYPE, linkname="..")
        _tar_add(tf, "trick", type=tarfile.SYMTYPE, linkname="sub/c/..")
    with pytest.raises(UnsafeArchiveError):
        extract(archive, tmp_path / "out", strict=True, progress=False)
    assert _siblings(tmp_path) == {"late.tar"}


@pytest.mark.parametrize("content", [b"", b"not an archive at all\n" * 50,
                                     b"PK\x03\x04garbage", b"\x1f\x8b\x08\x00broken"])
def test_unknown_or_corrupt_is_value_error(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.zip"
    bad.write_bytes(content)
    assert archive_kind(bad) is None
    with pytest.raises(ValueError, match=r"bad\.zip") as info:
        extract(bad, tmp_path / "out", progress=False)
    assert "\n" not in str(info.value)
    assert _siblings(tmp_path) == {"bad.zip"}


def test_truncated_archive_is_value_error(tmp_path: Path) -> None:
    good = _make_tar(tmp_path / "g.tar.gz", "w:gz")
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut\.tgz"):
        extract(cut, tmp_path / "out", progress=False)
    assert _siblings(tmp_path) == {"g.tar.gz", "cut.tgz"}


def test_interrupt_leaves_target_unchanged(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "top.txt").write_bytes(b"old")
    archive = _make_zip(tmp_path / "i.zip")
    real_copy = ex._copy_stream
    calls = []

    def interrupting(*args: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_copy(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(ex, "_copy_stream", interrupting)
    with pytest.raises(KeyboardInterrupt):
        extract(archive, target, progress=False)
    assert len(calls) == 2
    assert _tree(target) == {"top.txt": b"old"}
    assert _siblings(tmp_path) == {"out", "i.zip"}


def test_merge_into_existing_target(tmp_path: Path) -> None:
    target = tmp_path / "out"
    (target / "a").mkdir(parents=True)
    (target / "top.txt").write_bytes(b"old")
    (target / "a/keep.txt").write_bytes(b"keep")
    (target / "mine.txt").write_bytes(b"mine")
    old_inode = (target / "top.txt").stat().st_ino
    report = extract(_make_zip(tmp_path / "m.zip"), target, progress=False)
    assert report.extracted == 3
    assert _tree(target) == {**FILES, "a/keep.txt": b"keep", "mine.txt": b"mine"}
    assert (target / "top.txt").stat().st_ino != old_inode  # replaced by rename
    assert _siblings(tmp_path) == {"out", "m.zip"}


def test_merge_does_not_write_through_existing_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "out"
    target.mkdir()
    (target / "a").symlink_to(outside)
    with pytest.raises(ValueError, match="clashes"):
        extract(_make_zip(tmp_path / "m.zip"), target, progress=False)
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in target.iterdir()) == ["a"]
    assert _siblings(tmp_path) == {"out", "outside", "m.zip"}


def test_max_total_bytes(tmp_path: Path) -> None:
    archive = _make_zip(tmp_path / "big.zip")
    total = sum(len(v) for v in FILES.values())
    with pytest.raises(ValueError, match="limit"):
        extract(archive, tmp_path / "out", progress=False, max_total_bytes=total - 1)
    assert _siblings(tmp_path) == {"big.zip"}
    report = extract(archive, tmp_path / "out", progress=False, max_total_bytes=total)
    assert report.extracted == 3
