"""Safe extraction: real archives built here, extracted into real folders."""

from __future__ import annotations

import gzip
import io
import os
import random
import resource
import signal
import stat
import tarfile
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipycloud.runtime.storage import archive as ar
from ipycloud.runtime.storage import extract as ex
from ipycloud.runtime.storage import tar_stream as ts
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


# -- the expanded size ------------------------------------------------------------------------

MiB = 1 << 20


@pytest.fixture
def files_capped_at_64_mib() -> Iterator[None]:
    """A safety net: any file written past 64 MiB fails with EFBIG instead of filling the
    disk, should a limit fail to stop an extraction."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * MiB, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def _sparse_bomb(path: Path, size: int) -> Path:
    """A tar.gz of a few hundred bytes holding one sparse file of ``size`` bytes (GNU sparse
    format 1.0: a map of one data byte, zeros for the rest)."""
    sparse_map = b"1\n0\n1\n".ljust(512, b"\0")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("GNUSparseFile.0/zeros.bin")
        info.size = len(sparse_map) + 1
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                            "GNU.sparse.name": "zeros.bin", "GNU.sparse.realsize": str(size)}
        tf.addfile(info, io.BytesIO(sparse_map + b"x"))
    return path


def _fake_disk(monkeypatch: pytest.MonkeyPatch, *, total: int, free: int,
               inodes: int = 1_000_000, free_inodes: int = 1_000_000) -> None:
    """The file system reports ``total`` and ``free`` bytes in 4 KiB blocks (a disk this
    machine does not have: an almost full one)."""
    real = os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        st = real(path)
        return os.statvfs_result((4096, 4096, total // 4096, free // 4096, free // 4096,
                                  inodes, free_inodes, free_inodes, st.f_flag, st.f_namemax))

    monkeypatch.setattr(os, "statvfs", statvfs)


def _zeros_zip(path: Path, files: int, size: int) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for index in range(files):
            zf.writestr(f"z/{index:04d}.bin", bytes(size))
    return path


def test_a_bomb_larger_than_the_disk_is_refused_before_writing(
    tmp_path: Path, files_capped_at_64_mib: None
) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_bytes(b"keep")
    bomb = _sparse_bomb(tmp_path / "bomb.tar.gz", 1 << 50)  # 1 PiB of zeros
    assert bomb.stat().st_size < 1000
    with pytest.raises(ValueError, match="free space") as err:
        extract(bomb, target, progress=False)
    message = str(err.value)
    assert "\n" not in message and "bomb.tar.gz" in message and "max_total_bytes=" in message
    assert _tree(target) == {"keep.txt": b"keep"}
    assert _siblings(tmp_path) == {"bomb.tar.gz", "out"}


def test_the_default_limit_is_the_free_space_less_a_margin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = _zeros_zip(tmp_path / "z.zip", 3, MiB)  # 3 MiB of zeros in a few KiB
    _fake_disk(monkeypatch, total=100 * MiB, free=7 * MiB)  # margin: 5% of 100 MiB
    with pytest.raises(ValueError) as err:
        extract(archive, tmp_path / "out")
    assert "extract z.zip" not in capsys.readouterr().err  # refused before any writing
    message = str(err.value)
    assert "more than 2.0 MiB (2097152 bytes)" in message
    assert "free space" in message and "max_total_bytes=" in message and "\n" not in message
    assert _siblings(tmp_path) == {"z.zip"}
    report = extract(archive, tmp_path / "out", progress=False, max_total_bytes=3 * MiB)
    assert report.extracted == 3
    assert (tmp_path / "out/z/0002.bin").read_bytes() == bytes(MiB)


def test_the_default_limit_counts_whole_blocks_and_free_inodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _zeros_zip(tmp_path / "tiny.zip", 600, 1)  # 600 bytes, 600 blocks on disk
    _fake_disk(monkeypatch, total=100 * MiB, free=7 * MiB)  # room for 512 blocks
    with pytest.raises(ValueError, match="free space"):
        extract(archive, tmp_path / "out", progress=False)
    _fake_disk(monkeypatch, total=100 * MiB, free=50 * MiB, inodes=10_000, free_inodes=1000)
    with pytest.raises(ValueError, match="free inodes"):  # 600 members, 500 inodes free
        extract(archive, tmp_path / "out", progress=False)
    assert _siblings(tmp_path) == {"tiny.zip"}
    assert extract(archive, tmp_path / "out", progress=False,
                   max_total_bytes=600).extracted == 600


def test_a_sparse_member_is_written_with_its_holes(tmp_path: Path) -> None:
    archive = _sparse_bomb(tmp_path / "sparse.tar.gz", 3 * MiB + 5)
    report = extract(archive, tmp_path / "out", progress=False)
    assert report.extracted == 1 and report.refused == ()
    assert (tmp_path / "out/zeros.bin").read_bytes() == b"x" + bytes(3 * MiB + 4)


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:xz"])
def test_members_larger_than_a_chunk_round_trip(tmp_path: Path, mode: str) -> None:
    big = random.Random(7).randbytes(2 * MiB + 1234)  # read in three chunks
    archive = tmp_path / "big.tar"
    with tarfile.open(archive, mode) as tf:
        _tar_add(tf, "big.bin", big)
        _tar_add(tf, "after.txt", b"after")  # found where the padding ends
    report = extract(archive, tmp_path / "out", progress=False)
    assert report.extracted == 2
    assert _tree(tmp_path / "out") == {"big.bin": big, "after.txt": b"after"}


def test_a_member_outgrowing_its_declared_size_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader that yields more than the header declared (as a buggy or hostile decoder
    # would): the copy stops at the declared size instead of writing on.
    archive = _make_tar(tmp_path / "grow.tar")
    real_chunks = ar._TarSource.chunks

    def growing(self: ar._TarSource, member: ar.Member) -> Iterator[bytes | memoryview]:
        yield from real_chunks(self, member)
        yield b"and more"

    monkeypatch.setattr(ar._TarSource, "chunks", growing)
    with pytest.raises(ValueError, match="holds more bytes than the 4 it declares"):
        extract(archive, tmp_path / "out", progress=False)
    assert _siblings(tmp_path) == {"grow.tar"}


def test_progress_of_a_tar_counts_the_archive_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = _make_tar(tmp_path / "p.tar.gz", "w:gz")
    extract(archive, tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    assert "extract p.tar.gz" in err
    size = archive.stat().st_size
    assert f"{size}/{size}" in err or f"{size}.0/{size}.0" in err or "100%" in err


# -- the same refusals as tarfile's data filter -----------------------------------------------

def _hostile_tar(path: Path, outside: Path) -> Path:
    with tarfile.open(path, "w") as tf:
        _tar_add(tf, "ok.txt", b"ok")
        _tar_add(tf, "../evil", b"x")
        _tar_add(tf, "a/../../evil2", b"x")
        _tar_add(tf, str(outside / "abs"), b"x")
        _tar_add(tf, "link", type=tarfile.SYMTYPE, linkname=str(outside))
        _tar_add(tf, "link/through", b"x")
        _tar_add(tf, "rel", type=tarfile.SYMTYPE, linkname="../outside")
        _tar_add(tf, "sub/c", type=tarfile.SYMTYPE, linkname="..")
        _tar_add(tf, "trick", type=tarfile.SYMTYPE, linkname="sub/c/..")
        _tar_add(tf, "sub/c/../../evil3", b"x")  # lexically inside, really outside
        _tar_add(tf, "sub/c/../up/evil4", b"x")
        _tar_add(tf, "real", type=tarfile.DIRTYPE, mode=0o755)
        _tar_add(tf, "alias", type=tarfile.SYMTYPE, linkname="real")
        _tar_add(tf, "alias/f.txt", b"x")
        _tar_add(tf, "hard", type=tarfile.LNKTYPE, linkname=str(outside / "secret"))
        _tar_add(tf, "hard2", type=tarfile.LNKTYPE, linkname="../secret")
        _tar_add(tf, "same", type=tarfile.LNKTYPE, linkname="ok.txt")
        _tar_add(tf, "fifo", type=tarfile.FIFOTYPE)
        _tar_add(tf, "dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
        _tar_add(tf, "deep/../../../etc", type=tarfile.DIRTYPE, mode=0o755)
    return path


@pytest.mark.skipif(not hasattr(tarfile, "data_filter"), reason="tarfile has no data filter")
def test_every_member_tarfiles_data_filter_refuses_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    archive = _hostile_tar(tmp_path / "hostile.tar", outside)
    judged_by_tarfile: set[str] = set()

    def data_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError:
            judged_by_tarfile.add(member.name)
            return None  # skipped, as tarfile would with this filter

    sandbox = tmp_path / "sandbox/inner"  # tarfile's own extraction, one level down
    sandbox.mkdir(parents=True)
    with tarfile.open(archive) as tf:
        tf.extractall(sandbox, filter=data_filter)
    assert {"../evil", "link", "rel", "trick", "sub/c/../../evil3", "hard"} <= judged_by_tarfile
    report = extract(archive, tmp_path / "out", progress=False)
    ours = {r.split(": ")[0] for r in report.refused}
    assert judged_by_tarfile <= ours, judged_by_tarfile - ours
    assert (outside / "secret").read_bytes() == b"secret"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile.tar", "out", "outside",
                                                            "sandbox"]
    assert _tree(tmp_path / "out") == {"ok.txt": b"ok", "same": b"ok"}


# -- tar headers decoded as tarfile decodes them ---------------------------------------------

def _headers(tmp_path: Path) -> list[bytes]:
    """Every 512-byte block of archives in each format, holding every kind of member."""
    blocks = []
    for number, fmt in enumerate((tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT,
                                  tarfile.PAX_FORMAT)):
        path = tmp_path / f"{number}.tar"
        with tarfile.open(path, "w", format=fmt) as tf:
            _tar_add(tf, "plain.txt", b"data", uid=1000, gid=1000, uname="ü", gname="g",
                     mtime=1_700_000_000)
            _tar_add(tf, "dir/", type=tarfile.DIRTYPE, mode=0o755)
            _tar_add(tf, "v7dir/", type=tarfile.AREGTYPE)
            _tar_add(tf, "link", type=tarfile.SYMTYPE, linkname="plain.txt")
            _tar_add(tf, "hard", type=tarfile.LNKTYPE, linkname="plain.txt")
            _tar_add(tf, "dev", type=tarfile.BLKTYPE, devmajor=8, devminor=1)
            _tar_add(tf, "p" * 90 + "/" + "q" * 60, b"split by ustar's prefix")
            _tar_add(tf, "naïve/日本.txt", b"utf-8 name")
            if fmt != tarfile.USTAR_FORMAT:
                _tar_add(tf, "n" * 120, b"a long name")  # a GNU long name or a pax record
                _tar_add(tf, "big-uid", b"x", uid=8 ** 8 + 1)  # base-256 in GNU format
        data = path.read_bytes()
        blocks += [data[i:i + 512] for i in range(0, len(data), 512)]
    return blocks


def _decoded(cls: type[tarfile.TarInfo], block: bytes) -> object:
    try:
        info = cls.frombuf(block, "utf-8", "surrogateescape")
    except Exception as exc:  # the kind of failure is what is compared
        return type(exc)
    return info.get_info(), info.type, info.chksum


def test_a_header_blocks_byte_sum() -> None:
    rng = random.Random(5)
    blocks = [bytes(512), b"\xff" * 512, b"\x01" + bytes(511), bytes(range(256)) * 2]
    blocks += [rng.randbytes(512) for _ in range(2000)]
    blocks += [bytes(rng.choice((0, 255)) for _ in range(512)) for _ in range(200)]
    assert [ts._byte_sum(block) for block in blocks] == [sum(block) for block in blocks]


def test_plain_headers_are_decoded_without_tarfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks: list[bytes] = []
    real = tarfile.TarInfo.frombuf.__func__  # type: ignore[attr-defined]

    def counting(cls: type[tarfile.TarInfo], buf: bytes, *args: str) -> tarfile.TarInfo:
        blocks.append(bytes(buf))
        return real(cls, buf, *args)  # type: ignore[no-any-return]

    data = _make_tar(tmp_path / "plain.tar").read_bytes()
    monkeypatch.setattr(tarfile.TarInfo, "frombuf", classmethod(counting))
    names = [info.name for info in ts.TarStream(io.BufferedReader(io.BytesIO(data)))]
    assert names == ["a", *FILES]
    assert blocks == [bytes(512)]  # tarfile decoded only the end of the archive


def test_tar_headers_decode_as_tarfile_decodes_them(tmp_path: Path) -> None:
    blocks = _headers(tmp_path)
    rng = random.Random(20240611)
    mutated = []
    for _ in range(3000):  # damaged and odd headers: each is decoded the same or refused the same
        block = bytearray(rng.choice(blocks))
        for _ in range(rng.randint(1, 3)):
            block[rng.randrange(512)] = rng.choice((0, 32, 48, 55, 56, 0x80, 0xFF,
                                                    rng.randrange(256)))
        if rng.random() < 0.5:  # keep the checksum right, so the fields themselves are read
            block[148:156] = b"        "
            block[148:156] = b"%06o\x00 " % (sum(block) & 0o777777)
        mutated.append(bytes(block))
    for block in blocks + mutated:
        assert _decoded(ts.TarHeader, block) == _decoded(tarfile.TarInfo, block), block


# -- a tar read in one pass as tarfile reads it -----------------------------------------------

def _negative_size(name: str) -> bytes:
    """A header whose size field says -1, as tarfile reads it."""
    header = bytearray(tarfile.TarInfo(name).tobuf(tarfile.USTAR_FORMAT))
    header[124:136] = b"-0000000001\0"
    header[148:156] = b"%06o\0 " % (sum(header[:148]) + 256 + sum(header[156:]))
    return bytes(header)


def test_a_negative_size_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "negative.tar"
    archive.write_bytes(_negative_size("negative.bin") + _make_tar(tmp_path / "t.tar").read_bytes())
    report = extract(archive, tmp_path / "out", progress=False)
    assert report.refused == ("negative.bin: negative size -1",)
    _assert_round_trip(tmp_path / "out")


def _archive_corpus(tmp_path: Path) -> list[bytes]:
    """Archives of every format and shape: plain runs, pax and GNU records in the middle,
    sparse members, an early end, trailing garbage, a cut, damaged headers."""
    rng = random.Random(20240612)
    corpus = []
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tf:
            for index in range(12):
                _tar_add(tf, f"d{index % 3}/f{index}.bin", rng.randbytes(rng.randint(0, 1500)))
            _tar_add(tf, "d0", type=tarfile.DIRTYPE, mode=0o755)
            _tar_add(tf, "link", type=tarfile.SYMTYPE, linkname="d0/f0.bin", size=7)
            _tar_add(tf, "fifo", type=tarfile.FIFOTYPE, size=3)  # no data follows either
            if fmt != tarfile.USTAR_FORMAT:
                _tar_add(tf, "x" * 150 + "/long.bin", b"after a long-name record")
                _tar_add(tf, "ü.txt", b"a pax record in pax format")
                _tar_add(tf, "after.bin", b"read by tarfile, after the hand-over")
        corpus.append(buffer.getvalue())
    corpus.append(gzip.decompress(_sparse_bomb(tmp_path / "sparse.tar.gz", 5000).read_bytes()))
    plain = corpus[0]
    corpus += [_negative_size("negative.bin") + plain,
               plain[:4096] + bytes(1024) + plain[4096:],  # an end block in the middle
               plain + b"trailing garbage" * 100,
               plain[: len(plain) // 2],  # cut mid-member
               plain[:600],  # cut in the data of the first member, which is skipped
               plain[:2560]]
    with tarfile.open(fileobj=io.BytesIO(plain)) as tf:  # cut in the padding of a member read
        member = next(m for i, m in enumerate(tf) if i % 2 and m.size % 512 not in (0, 511))
    corpus.append(plain[: member.offset_data + member.size + 1])
    for _ in range(60):  # damaged headers and data, anywhere
        damaged = bytearray(rng.choice(corpus[:3]))
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        corpus.append(bytes(damaged))
    return corpus


def _read_all(members: Iterator[tarfile.TarInfo], data: Callable[[tarfile.TarInfo], bytes]
              ) -> list[object]:
    """What reading yields, member by member, up to the failure that ends it (if any); the
    data of every other regular member is left unread (skipped)."""
    seen: list[object] = []
    try:
        for number, info in enumerate(members):
            content = data(info) if info.isreg() and number % 2 else None
            seen.append((info.get_info(), info.type, info.offset, info.offset_data,
                         info.sparse, content))
    except (tarfile.TarError, EOFError, OSError) as exc:
        seen.append(type(exc).__name__)
    return seen


def test_the_stream_reads_every_archive_as_tarfile_does(tmp_path: Path) -> None:
    for number, archive in enumerate(_archive_corpus(tmp_path)):
        try:
            with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
                expected = _read_all(iter(tf), lambda i, tf=tf: tf.extractfile(i).read())
        except tarfile.ReadError:
            expected = ["ReadError"]  # not a tar from its first block: nothing read
        stream = ts.TarStream(io.BufferedReader(io.BytesIO(archive)))
        got = _read_all(iter(stream), lambda i, s=stream: b"".join(map(bytes, s.chunks(i))))
        assert got == expected, f"archive {number}"
