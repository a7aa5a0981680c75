"""Incremental folder sync on real files: atomic copies, deletion only on request, restarts."""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from faultfs import CHANGING, FaultyMount
from waiting import wait_for

from ipycloud.runtime.storage import periodic_sync as background_module
from ipycloud.runtime.storage import transfer as transfer_module
from ipycloud.runtime.storage import tree as tree_module
from ipycloud.runtime.storage.failed_syncs import failed_syncs
from ipycloud.runtime.storage.periodic_sync import BackgroundSync, background_sync_of, running_syncs
from ipycloud.runtime.storage.sync import SyncReport, sync

OnBytes = Callable[[int], object]
FILES = {"a.txt": b"alpha", "b.bin": bytes(range(256)) * 40, "sub/c.txt": b"gamma",
         "sub/deep/d.txt": b"delta" * 1000, "e.txt": b"epsilon"}


def make_tree(root: Path, files: dict[str, bytes] = FILES) -> None:
    """Write ``files`` under ``root`` with distinct modes and old mtimes."""
    for index, (rel, data) in enumerate(files.items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o640 if index % 2 else 0o755)
        stamp = 1_600_000_000_123_456_789 + index * 1_000_000_000
        os.utime(path, ns=(stamp, stamp))


def listing(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under ``root``: mode, mtime and content (empty for folders)."""
    result = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() else b""
        result[path.relative_to(root).as_posix()] = (st.st_mode, st.st_mtime_ns, data)
    return result


def files_only(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """``listing`` restricted to regular files."""
    return {rel: v for rel, v in listing(root).items() if (root / rel).is_file()}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    make_tree(root)
    return root


def test_first_sync_copies_everything_with_metadata(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out" / "dst"
    report = sync(src, dst, progress=False)
    assert sorted(report.copied) == sorted(FILES)
    assert report.bytes_copied == sum(len(v) for v in FILES.values())
    for rel, data in FILES.items():
        s, d = (src / rel).stat(), (dst / rel).stat()
        assert (dst / rel).read_bytes() == data
        assert d.st_mtime_ns == s.st_mtime_ns
        assert d.st_mode & 0o777 == s.st_mode & 0o777
    assert not [p for p in dst.rglob(".tmp-*")]


def test_second_sync_copies_nothing(src: Path, tmp_path: Path) -> None:
    sync(src, tmp_path / "dst", progress=False)
    report = sync(src, tmp_path / "dst", progress=True)
    assert (report.copied, report.updated, report.deleted) == ((), (), ())
    assert report.unchanged == len(FILES)
    assert report.summary() == f"0 copied, 0 updated, 0 deleted, {len(FILES)} unchanged (0 B)"


def test_modified_file_is_the_only_update(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    sync(src, dst, progress=False)
    (src / "sub/c.txt").write_bytes(b"gamma, changed")
    report = sync(src, dst, progress=False)
    assert report.updated == ("sub/c.txt",)
    assert report.copied == ()
    assert report.unchanged == len(FILES) - 1
    assert (dst / "sub/c.txt").read_bytes() == b"gamma, changed"


def test_same_size_and_mtime_needs_checksum(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    sync(src, dst, progress=False)
    target = src / "a.txt"
    before = target.stat()
    target.write_bytes(b"ALPHA")
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert sync(src, dst, progress=False).updated == ()
    assert (dst / "a.txt").read_bytes() == b"alpha"
    report = sync(src, dst, checksum=True, progress=False)
    assert report.updated == ("a.txt",)
    assert (dst / "a.txt").read_bytes() == b"ALPHA"


def test_whole_second_destination_mtime_counts_as_equal(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    sync(src, dst, progress=False)
    st = (dst / "a.txt").stat()
    os.utime(dst / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns // 10**9 * 10**9))
    assert sync(src, dst, progress=False).updated == ()
    os.utime(dst / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    assert sync(src, dst, progress=False).updated == ("a.txt",)


def test_extra_files_kept_unless_delete(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    sync(src, dst, progress=False)
    (dst / "extra.txt").write_text("mine")
    (dst / "old/inner").mkdir(parents=True)
    (dst / "old/inner/x.txt").write_text("x")
    report = sync(src, dst, progress=False)
    assert report.deleted == ()
    assert (dst / "extra.txt").exists() and (dst / "old/inner/x.txt").exists()
    report = sync(src, dst, delete=True, progress=False)
    assert set(report.deleted) == {"extra.txt", "old", "old/inner", "old/inner/x.txt"}
    assert not (dst / "extra.txt").exists() and not (dst / "old").exists()
    assert dst.is_dir()
    assert files_only(dst).keys() == set(FILES)


def test_delete_removes_only_inside_dst(src: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "link").symlink_to(outside, target_is_directory=True)
    report = sync(src, dst, delete=True, progress=False)
    assert "link" in report.deleted
    assert (outside / "keep.txt").read_text() == "keep"


def test_dry_run_touches_nothing(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    sync(src, dst, progress=False)
    (src / "new.txt").write_text("new")
    (src / "a.txt").write_text("changed!")
    (dst / "extra.txt").write_text("extra")
    stale = dst / ".tmp-999999999-deadbeef-a.txt"
    stale.write_text("stale")
    before_src, before_dst = listing(src), listing(dst)
    report = sync(src, dst, delete=True, dry_run=True, progress=False)
    assert listing(src) == before_src and listing(dst) == before_dst
    assert report.dry_run and report.copied == ("new.txt",) and report.updated == ("a.txt",)
    assert report.deleted == ("extra.txt",)
    assert report.summary().startswith("dry run: 1 copied, 1 updated, 1 deleted")
    assert sync(src, tmp_path / "never", dry_run=True, progress=False).copied
    assert not (tmp_path / "never").exists()


def test_names_up_to_name_max_are_synced(src: Path, tmp_path: Path) -> None:
    """A name of 255 bytes is legal, so its temporary copy must be too."""
    long_names = {"x" * 240: b"ascii", "é" * 127: b"two-byte characters",
                  "sub/" + "a" + "😀" * 63: b"four-byte characters"}
    make_tree(src, long_names)
    dst = tmp_path / "dst"
    report = sync(src, dst, progress=False)
    assert set(long_names) <= set(report.copied)
    assert {rel: v[2] for rel, v in files_only(dst).items()} == {**FILES, **long_names}
    assert sync(src, dst, progress=False).unchanged == len(FILES) + len(long_names)


def test_stale_temporary_files_are_cleaned(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    (dst / "sub").mkdir(parents=True)
    stale = dst / "sub" / ".tmp-999999999-deadbeef-c.txt"
    stale.write_text("torn")
    sync(src, dst, progress=False)
    assert not stale.exists()
    assert (dst / "sub/c.txt").read_bytes() == FILES["sub/c.txt"]


def test_source_entries_named_like_temporaries_are_synced_and_never_taken_for_leftovers(
        src: Path, tmp_path: Path) -> None:
    """Only the destination's own leftovers are temporary: names like this process's or a
    dead writer's temporary files, in the source, are the user's files."""
    named = {f".tmp-{os.getpid()}-0123abcd-x": b"this process's pattern",
             ".tmp-999999999-0123abcd-y": b"a dead writer's pattern",
             ".tmp-999999999-0123abcd-folder/inner.txt": b"inside"}
    make_tree(src, named)
    dst = tmp_path / "dst"
    report = sync(src, dst, progress=False)
    assert set(named) <= set(report.copied)
    assert {rel: v[2] for rel, v in files_only(dst).items()} == {**FILES, **named}
    again = sync(src, dst, delete=True, progress=False)
    assert (again.copied, again.updated, again.deleted) == ((), (), ())
    assert again.unchanged == len(FILES) + len(named)
    assert {rel: v[2] for rel, v in files_only(dst).items()} == {**FILES, **named}


def test_a_destination_folder_named_like_a_temporary_is_kept(src: Path, tmp_path: Path) -> None:
    """Sync makes temporary files and links, never folders: such a folder is the user's."""
    folder = tmp_path / "dst" / ".tmp-999999999-0123abcd-mine"
    folder.mkdir(parents=True)
    (folder / "keep.txt").write_text("keep")
    report = sync(src, tmp_path / "dst", progress=False)
    assert sorted(report.copied) == sorted(FILES)
    assert (folder / "keep.txt").read_text() == "keep"


def test_interrupted_sync_leaves_no_partial_and_rerun_completes(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dst = tmp_path / "dst"
    real_copy = transfer_module.copy_contents
    calls = {"files": 0}

    def interrupting(reader: int, writer: int, size: int, on_bytes: OnBytes) -> int:
        calls["files"] += 1
        if calls["files"] == 3:
            os.write(writer, os.pread(reader, 2, 0))  # a partial temporary file exists
            raise KeyboardInterrupt
        return real_copy(reader, writer, size, on_bytes)

    monkeypatch.setattr(transfer_module, "copy_contents", interrupting)
    with pytest.raises(KeyboardInterrupt):
        sync(src, dst, progress=False)
    present = files_only(dst)
    assert len(present) == 2
    for rel, (_, _, data) in present.items():
        assert data == FILES[rel]
    assert not list(dst.rglob(".tmp-*"))
    monkeypatch.setattr(transfer_module, "copy_contents", real_copy)
    report = sync(src, dst, progress=False)
    assert len(report.copied) == len(FILES) - 2 and report.unchanged == 2
    assert {rel: v[2] for rel, v in files_only(dst).items()} == FILES


def _growing_copy(grower: Path, times: int | None) -> Callable[[int, int, int, OnBytes], int]:
    """A copy that appends to ``grower`` after each copy of it (at most ``times`` times)."""
    real_copy = transfer_module.copy_contents
    appended = {"n": 0}

    def growing(reader: int, writer: int, size: int, on_bytes: OnBytes) -> int:
        copied = real_copy(reader, writer, size, on_bytes)
        if os.fstat(reader).st_ino == grower.stat().st_ino and (
                times is None or appended["n"] < times):
            appended["n"] += 1
            with open(grower, "ab") as more:
                more.write(b"+more")
        return copied

    return growing


def test_file_growing_during_copy_is_retried(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grower = src / "b.bin"
    monkeypatch.setattr(transfer_module, "copy_contents", _growing_copy(grower, 2))
    dst = tmp_path / "dst"
    report = sync(src, dst, progress=False)
    assert "b.bin" in report.copied and report.skipped == ()
    assert grower.read_bytes().endswith(b"+more+more")
    assert (dst / "b.bin").read_bytes() == grower.read_bytes()


def test_file_that_never_settles_is_skipped_not_torn(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grower = src / "b.bin"
    monkeypatch.setattr(transfer_module, "copy_contents", _growing_copy(grower, None))
    dst = tmp_path / "dst"
    report = sync(src, dst, progress=False)
    assert report.skipped == ("b.bin",)
    assert "b.bin" not in report.copied
    assert not (dst / "b.bin").exists()
    assert not list(dst.rglob(".tmp-*"))
    assert "1 skipped" in report.summary()


def test_local_disk_is_flushed_once_per_sync_that_changed_something(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flushed: list[str] = []
    real_flush = transfer_module.flush_filesystem
    monkeypatch.setattr(transfer_module, "flush_filesystem",
                        lambda path: (flushed.append(str(path)), real_flush(path)))
    dst = tmp_path / "dst"
    assert transfer_module.can_flush_whole(tmp_path)  # the test folder is on a local disk
    sync(src, dst, progress=False)
    assert flushed == [str(dst)]
    sync(src, dst, progress=False)
    assert flushed == [str(dst)]  # nothing changed, nothing to flush
    (src / "a.txt").write_text("changed")
    sync(src, dst, progress=False)
    assert flushed == [str(dst)] * 2


def test_elsewhere_each_copy_is_fsynced_before_its_rename(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a whole-file-system flush is not trusted (FUSE, NFS), every copy is fsynced
    under its temporary name, and only then renamed."""
    dst = tmp_path / "dst"
    fsynced: list[str] = []
    real_fsync = transfer_module.fsync_file

    def recording_fsync(path: str) -> None:
        assert Path(path).name.startswith(".tmp-")
        real_fsync(path)
        fsynced.append(Path(path).name.split("-", 3)[3])

    monkeypatch.setattr(transfer_module, "can_flush_whole", lambda path: False)
    monkeypatch.setattr(transfer_module, "flush_filesystem", lambda path: pytest.fail("flushed"))
    monkeypatch.setattr(transfer_module, "fsync_file", recording_fsync)
    report = sync(src, dst, progress=False)
    assert sorted(fsynced) == sorted(Path(rel).name for rel in FILES)
    assert sorted(report.copied) == sorted(FILES)
    assert {rel: v[2] for rel, v in files_only(dst).items()} == FILES


@pytest.mark.parametrize("inside", ["dst_in_src", "src_in_dst", "same"])
def test_nested_folders_are_refused(tmp_path: Path, inside: str) -> None:
    outer = tmp_path / "outer"
    (outer / "inner").mkdir(parents=True)
    pairs = {"dst_in_src": (outer, outer / "inner"), "src_in_dst": (outer / "inner", outer),
             "same": (outer, outer)}
    a, b = pairs[inside]
    with pytest.raises(ValueError, match="lies inside"):
        sync(a, b, progress=False)


def test_missing_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an existing folder"):
        sync(tmp_path / "nope", tmp_path / "dst", progress=False)
    assert not (tmp_path / "dst").exists()


def test_symlinks_are_copied_as_links(src: Path, tmp_path: Path) -> None:
    (src / "to_a").symlink_to("a.txt")
    report = sync(src, tmp_path / "dst", progress=False)
    assert "to_a" in report.copied
    assert os.readlink(tmp_path / "dst" / "to_a") == "a.txt"
    assert sync(src, tmp_path / "dst", progress=False).unchanged == len(FILES) + 1


def test_destination_on_another_file_system(src: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == src.stat().st_dev:
        pytest.fail("this test needs /dev/shm on a file system other than tmp_path")
    dst = shm / f"ipycloud-sync-test-{uuid.uuid4().hex}"
    try:
        report = sync(src, dst, progress=False)
        assert sorted(report.copied) == sorted(FILES)
        assert {rel: v[2] for rel, v in files_only(dst).items()} == FILES
        assert sync(src, dst, progress=False).unchanged == len(FILES)
    finally:
        shutil.rmtree(dst, ignore_errors=True)


def test_report_displays_its_summary(src: Path, tmp_path: Path) -> None:
    report = sync(src, tmp_path / "dst", progress=False)
    assert isinstance(report, SyncReport)
    assert str(report) == report.summary()
    texts: list[str] = []

    class Printer:
        def text(self, value: str) -> None:
            texts.append(value)

    report._repr_pretty_(Printer(), False)
    assert texts == [report.summary()]
    assert report.summary().startswith(f"{len(FILES)} copied, 0 updated, 0 deleted, 0 unchanged")


def test_background_sync_follows_changes(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    background = BackgroundSync(src, dst, every_s=0.2).start()
    try:
        assert background.running
        assert wait_for(lambda: (dst / "a.txt").exists())
        (src / "fresh.txt").write_text("fresh")
        assert wait_for(lambda: (dst / "fresh.txt").exists())
    finally:
        (src / "last.txt").write_text("last")
        report = background.stop()
    assert not background.running
    assert report is not None and report.copied == ("last.txt",)
    assert (dst / "last.txt").read_text() == "last"
    assert background.last_error is None


def test_background_error_is_kept_and_raised_on_stop(
        src: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    background = BackgroundSync(src, blocker / "dst", every_s=0.2)
    with caplog.at_level(logging.ERROR, logger=background_module.__name__):
        background.start()
        assert wait_for(lambda: background.last_error is not None)
    assert isinstance(background.last_error, OSError)
    assert "background sync" in caplog.text
    with pytest.raises(OSError):
        background.stop(final=False)
    assert not background.running


def test_background_stop_raises_kept_error_even_after_recovery(
        src: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    background = BackgroundSync(src, blocker / "dst", every_s=0.2).start()
    assert wait_for(lambda: background.last_error is not None)
    blocker.unlink()
    with pytest.raises(OSError):
        background.stop(final=True)
    assert (blocker / "dst" / "a.txt").exists()


def test_background_sync_keeps_its_folders_after_the_working_folder_changes(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative folders are resolved at the start: a later %cd does not move the sync."""
    monkeypatch.chdir(tmp_path)
    background = BackgroundSync("src", "dst", every_s=3600).start()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        assert wait_for(lambda: (tmp_path / "dst" / "a.txt").exists())
        monkeypatch.chdir(elsewhere)
        (src / "late.txt").write_text("late")
        report = background.sync_now()
    finally:
        background.stop(final=False)
    assert report.copied == ("late.txt",)
    assert (tmp_path / "dst" / "late.txt").read_text() == "late"
    assert list(elsewhere.iterdir()) == []
    assert background.action_name == f"sync {src} -> {tmp_path / 'dst'}"


def test_a_running_background_sync_is_a_deadline_action(src: Path, tmp_path: Path) -> None:
    """Before the session ends (%keepalive) every running background sync runs once more."""
    from ipycloud.runtime.guard import deadline

    dst = tmp_path / "dst"
    background = BackgroundSync(src, dst, every_s=3600).start()
    try:
        assert wait_for(lambda: (dst / "a.txt").exists())
        assert background.action_name in deadline.registered_actions()
        (src / "late.txt").write_text("written after the first run")
        run = deadline.run_actions("test deadline")
        assert run.failures == []
        assert (dst / "late.txt").read_text() == "written after the first run"
    finally:
        background.stop(final=False)
    assert background.action_name not in deadline.registered_actions()


def test_starting_a_pair_again_replaces_its_background_sync(src: Path, tmp_path: Path) -> None:
    """One background sync per (source, destination): the newest, with its own options."""
    first = BackgroundSync(src, tmp_path / "dst", every_s=3600).start()
    assert wait_for(lambda: first.last_report is not None)
    (src / "gone.txt").write_text("gone")
    sync(src, tmp_path / "dst", progress=False)
    (src / "gone.txt").unlink()
    second = BackgroundSync(src, tmp_path / "dst", every_s=600, delete=True).start()
    other = BackgroundSync(src, tmp_path / "other", every_s=3600).start()
    try:
        assert second.replaced is first and not first.running and second.running
        assert running_syncs() == [second, other]
        assert background_sync_of(src, tmp_path / "dst") is second
        assert wait_for(lambda: not (tmp_path / "dst/gone.txt").exists())  # delete=True
    finally:
        second.stop(final=False)
        other.stop(final=False)
    assert running_syncs() == [] and background_sync_of(src, tmp_path / "dst") is None


EXIT_AFTER_A_FIRST_RUN = """
import shutil, sys, time
from pathlib import Path
from ipycloud.runtime.storage.periodic_sync import BackgroundSync
src, dst, breaking = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "break"
background = BackgroundSync(src, dst, every_s=3600).start()
while background.last_report is None:
    time.sleep(0.01)
if breaking:
    shutil.rmtree(dst)
    dst.write_text("a file where the folder was")
else:
    (src / "late.txt").write_text("written after the first run")
"""


def exit_after_a_first_run(src: Path, dst: Path,
                           breaking: bool) -> subprocess.CompletedProcess[str]:
    """A process that starts a background sync, waits for its first run, breaks the
    destination (or adds a file to the source), and exits: its final sync runs at exit."""
    return subprocess.run(
        [sys.executable, "-c", EXIT_AFTER_A_FIRST_RUN, str(src), str(dst),
         "break" if breaking else "keep"], capture_output=True, text=True, timeout=120)


def test_a_final_sync_at_exit_that_fails_is_on_stderr_recorded_and_made_up_for(
        src: Path, tmp_path: Path, state_home: Path) -> None:
    dst = tmp_path / "it's kept"
    exited = exit_after_a_first_run(src, dst, breaking=True)
    assert exited.returncode == 0, exited.stderr
    (failure,) = failed_syncs()  # read back in another process: what a new kernel sees
    assert (failure.src, failure.dst) == (str(src), str(dst))
    assert failure.error == (f"NotADirectoryError: [Errno 20] sync destination {str(dst)!r} "
                             "is not a folder")
    assert re.fullmatch(
        rf"the final sync of {re.escape(repr(str(src)))} -> {re.escape(repr(str(dst)))} at exit "
        rf"\(\d{{4}}-\d\d-\d\d \d\d:\d\d\) failed: {re.escape(failure.error)}; run "
        rf"ipycloud\.sync\({re.escape(repr(str(src)))}, {re.escape(repr(str(dst)))}\)",
        str(failure)), str(failure)
    assert exited.stderr == f"ipycloud: {failure}\n"
    assert [path.parent for path in state_home.rglob("*.json")] == [state_home / "failed-syncs"]
    dst.unlink()
    planned = sync(src, dst, dry_run=True, progress=False)
    assert planned.after_failure == failure and failed_syncs() == [failure]
    report = sync(src, dst, progress=False)
    assert report.after_failure == failure and failed_syncs() == []
    assert str(report) == (f"{report.summary()}\nit makes up for the final sync at exit "
                           f"({failure.when()}), which failed: {failure.error}")
    assert sync(src, dst, progress=False).after_failure is None


def test_a_final_sync_at_exit_that_works_says_nothing(src: Path, tmp_path: Path) -> None:
    exited = exit_after_a_first_run(src, tmp_path / "dst", breaking=False)
    assert (exited.returncode, exited.stderr) == (0, "")
    assert (tmp_path / "dst/late.txt").read_text() == "written after the first run"
    assert failed_syncs() == []


def assert_whole_copies_only(src: Path, dst: Path) -> None:
    """``dst`` holds exactly the files of ``src``, each whole: no torn copy under a final
    name (sync never deletes one, so it would still be there) and no temporary file."""
    assert {rel: v[2] for rel, v in files_only(dst).items()} == {
        rel: v[2] for rel, v in files_only(src).items()}


def survives_the_fault(src: Path, dst: Path, code: int, break_it: Callable[[], object],
                       fix: Callable[[], object], later: int | None = None) -> None:
    """A background sync from ``src`` to ``dst`` runs fine; after ``break_it()`` it fails
    with ``code`` and runs (and fails, with ``code`` or ``later``) again; once ``fix()``
    is done it runs fine, naming the error it kept until stop() raises it; ``dst`` then
    holds whole copies only."""
    background = BackgroundSync(src, dst, every_s=0.05).start()
    try:
        assert wait_for(lambda: background.last_report is not None)
        break_it()
        assert wait_for(lambda: background.last_error is not None)
        first = background.last_error
        assert isinstance(first, OSError) and first.errno == code, first
        assert f"failed: OSError: [Errno {code}] " in str(background)
        assert wait_for(lambda: background.last_error is not first)  # it kept running
        assert background.running
        fix()
        assert wait_for(lambda: " ok: " in str(background))
        codes = f"({code}|{later})" if later else code
        assert re.search(rf" ok: .*; a run at \d\d:\d\d:\d\d failed: \w+: \[Errno {codes}\] ",
                         str(background)), str(background)
    finally:
        with pytest.raises(OSError) as kept:
            background.stop(final=False)
    assert kept.value.errno in (code, later)
    assert_whole_copies_only(src, dst)


def test_a_full_destination_fails_runs_but_tears_no_file(
        src: Path, small_tmpfs: Callable[[str], Path]) -> None:
    dst = small_tmpfs("2m")
    big = src / "big.bin"

    def make_room() -> None:
        assert not (dst / "big.bin").exists()  # never a torn copy under its final name
        big.unlink()

    survives_the_fault(src, dst, errno.ENOSPC,
                       lambda: big.write_bytes(os.urandom(3 * 1024 * 1024)), make_room)


@pytest.mark.parametrize("code", [errno.EIO, errno.EROFS], ids=["EIO", "EROFS"])
def test_a_destination_that_refuses_writes_fails_runs_but_tears_no_file(
        src: Path, faulty_mount: FaultyMount, code: int) -> None:
    """Drive's mount answers writes with EIO midway through a file, or turns read-only."""
    dst = faulty_mount.path / "outputs"

    def break_it() -> None:
        (src / "b.bin").write_bytes(b"changed " * 4096)
        faulty_mount.fail(code, ops="write" if code == errno.EIO else CHANGING,
                          path="outputs/*b.bin", after_bytes=4096)

    def heal() -> None:
        assert (dst / "b.bin").read_bytes() == FILES["b.bin"]  # the old copy, whole
        faulty_mount.heal()

    survives_the_fault(src, dst, code, break_it, heal)


def test_a_destination_mount_that_vanishes_fails_runs_and_recovers_when_back(
        src: Path, faulty_mount: FaultyMount) -> None:
    """Drive's FUSE process dies: every access fails with ENOTCONN ("Transport endpoint
    is not connected") until it is mounted again. Meanwhile, while the mount point is a
    bare local folder, the sync must not make its destination there: the files would land
    on the local disk, and the mount would then refuse the non-empty folder."""
    dst = faulty_mount.path / "outputs"

    def vanish() -> None:
        (src / "late.txt").write_text("written while the mount was gone")
        faulty_mount.vanish()

    survives_the_fault(src, dst, errno.ENOTCONN, vanish, faulty_mount.come_back,
                       later=errno.ENOENT)  # unmounted: "is its storage still mounted?"


def test_after_a_run_that_worked_a_background_sync_never_makes_its_destination_again(
        src: Path, tmp_path: Path) -> None:
    """The destination going away is what an unmounted Drive looks like: making it again
    would put the files on the local disk, below the mount point."""
    mount_point = tmp_path / "drive"
    dst = mount_point / "MyDrive" / "outputs"
    background = BackgroundSync(src, dst, every_s=0.05).start()
    assert wait_for(lambda: background.last_report is not None)  # it made dst
    shutil.rmtree(mount_point / "MyDrive")
    assert wait_for(lambda: background.last_error is not None)
    assert str(background.last_error) == (
        f"[Errno 2] sync destination {str(dst)!r} is missing: is its storage still mounted?")
    with pytest.raises(FileNotFoundError):
        background.stop(final=True)  # the final run finds it missing too
    assert list(mount_point.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        sync(src, dst, create_dst=False, progress=False)
    assert sync(src, dst, progress=False).copied  # a sync of its own makes it


def test_a_destination_that_goes_midway_is_not_made_again_through_a_new_subfolder(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unmounted right after it was listed: the new subfolder would make it again."""
    mount_point = tmp_path / "drive"
    dst = mount_point / "outputs"
    sync(src, dst, progress=False)
    make_tree(src, {"new/inner.txt": b"new"})
    real_scan = tree_module.scan

    def scan_then_unmount(root: str) -> tuple[dict[str, os.stat_result], list[str]]:
        listed = real_scan(root)
        if root == str(dst):
            shutil.rmtree(dst)
        return listed

    monkeypatch.setattr(tree_module, "scan", scan_then_unmount)
    with pytest.raises(FileNotFoundError):
        sync(src, dst, create_dst=False, progress=False)
    assert list(mount_point.iterdir()) == []


def test_a_reset_stops_every_background_sync_even_one_that_kept_an_error(
        src: Path, tmp_path: Path) -> None:
    from ipycloud.runtime.per_process import reset_process_state

    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    failing = BackgroundSync(src, blocker / "dst", every_s=3600).start()
    working = BackgroundSync(src, tmp_path / "dst", every_s=3600).start()
    assert wait_for(lambda: failing.last_error is not None and working.last_report is not None)
    reset_process_state()
    assert running_syncs() == [] and not failing.running and not working.running
