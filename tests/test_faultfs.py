"""The fault-injecting file system (tests/faultfs.py) does what the storage tests rely on:
real syscalls through a real FUSE mount get the errors it was told to give, and only
those; it vanishes and comes back as Drive does; it never leaves a mount behind."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import pytest
from faultfs import CHANGING, FaultyMount, mount_points, mounted
from faultfs_daemon import OPERATIONS
from waiting import wait_for

ERRORS = (errno.ENOTCONN, errno.EIO, errno.ENOSPC, errno.EROFS)
_numbers = count()


def fresh(folder: Path) -> Path:
    """A name nothing uses yet in ``folder``."""
    return folder / f"new {next(_numbers)}"


def new_file(mount: Path) -> Path:
    path = fresh(mount)
    path.write_bytes(b"x")
    return path


def new_folder(mount: Path) -> Path:
    path = fresh(mount)
    path.mkdir()
    return path


def existing_file(mount: Path) -> Path:
    return mount / "file"


def call_on_descriptor(path: Path, flags: int, action: Callable[[int], object]) -> None:
    fd = os.open(path, flags)
    try:
        action(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Probe:
    """Syscalls through the mount that a fault on the class ``hits`` must fail; they go
    through stat (every lookup) and the classes ``needs`` too, and a fault on any other
    class must leave them alone.
    ``prepare(mount)`` gives the path they act on, before any fault is set."""

    hits: str
    needs: frozenset[str]
    act: Callable[[Path], object]
    prepare: Callable[[Path], Path] = existing_file


# Every close sends a flush; opening a folder, to read or to fsync it, is an opendir
# (class listdir).
PROBES = [
    Probe("stat", frozenset(), os.stat),
    Probe("stat", frozenset(), lambda path: os.statvfs(path.parent)),
    Probe("stat", frozenset(), os.readlink,
          prepare=lambda mount: _symlink(fresh(mount))),
    Probe("listdir", frozenset(), os.listdir, prepare=new_folder),
    Probe("open", frozenset({"flush"}), lambda path: os.close(os.open(path, os.O_RDONLY))),
    Probe("create", frozenset({"flush"}),
          lambda path: os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)),
          prepare=fresh),
    Probe("create", frozenset({"flush"}), lambda path: os.close(os.open(path, os.O_WRONLY))),
    Probe("create", frozenset(), lambda path: os.truncate(path, 0), prepare=new_file),
    Probe("read", frozenset({"open", "flush"}),
          lambda path: call_on_descriptor(path, os.O_RDONLY, lambda fd: os.read(fd, 10)),
          prepare=new_file),
    Probe("write", frozenset({"create", "flush"}),
          lambda path: call_on_descriptor(path, os.O_WRONLY, lambda fd: os.write(fd, b"y"))),
    Probe("flush", frozenset({"open"}), lambda path: os.close(os.open(path, os.O_RDONLY))),
    Probe("fsync", frozenset({"open", "flush"}),
          lambda path: call_on_descriptor(path, os.O_RDONLY, os.fsync)),
    Probe("fsync", frozenset({"listdir"}),
          lambda path: call_on_descriptor(path, os.O_RDONLY | os.O_DIRECTORY, os.fsync),
          prepare=new_folder),
    Probe("rename", frozenset(), lambda path: os.rename(path, fresh(path.parent)),
          prepare=new_file),
    Probe("rename", frozenset(), lambda path: os.replace(path, path.parent / "file"),
          prepare=new_file),
    Probe("unlink", frozenset(), os.unlink, prepare=new_file),
    Probe("unlink", frozenset(), os.rmdir, prepare=new_folder),
    Probe("mkdir", frozenset(), os.mkdir, prepare=fresh),
    Probe("link", frozenset(), lambda path: os.symlink("file", path), prepare=fresh),
    Probe("link", frozenset(), lambda path: os.link(path.parent / "file", path), prepare=fresh),
    Probe("setattr", frozenset(), lambda path: os.chmod(path, 0o640)),
    Probe("setattr", frozenset(), lambda path: os.utime(path, ns=(1, 2))),
]


def _symlink(path: Path) -> Path:
    path.symlink_to("file")
    return path


def test_every_class_of_operations_has_a_probe() -> None:
    assert {probe.hits for probe in PROBES} == OPERATIONS


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_a_fault_fails_its_operations_and_no_other(faulty_mount: FaultyMount,
                                                  operation: str) -> None:
    mount = faulty_mount.path
    (mount / "file").write_bytes(b"x")
    for error in ERRORS:
        for probe in PROBES:
            if probe.hits != operation and operation in {"stat", *probe.needs}:
                continue  # it cannot get past the fault to an operation of its own
            path = probe.prepare(mount)
            faulty_mount.fail(error, ops=operation)
            if probe.hits == operation:
                with pytest.raises(OSError) as raised:
                    probe.act(path)
                assert raised.value.errno == error, (probe, raised.value)
            else:
                probe.act(path)
            faulty_mount.heal()


def test_the_mount_mirrors_its_backing_folder(faulty_mount: FaultyMount) -> None:
    mount, backing = faulty_mount.path, faulty_mount.backing
    name = "it's a \"file\" with spaces.bin"
    (mount / name).write_bytes(b"through the mount")
    (backing / "folder").mkdir()
    (backing / "folder" / "b.txt").write_text("from the backing")
    assert (backing / name).read_bytes() == b"through the mount"
    assert sorted(os.listdir(mount)) == sorted([name, "folder"])
    assert (mount / "folder" / "b.txt").read_text() == "from the backing"

    os.symlink(name, mount / "link")
    os.link(mount / name, mount / "hard link")
    os.chmod(mount / name, 0o600)
    os.utime(mount / name, ns=(1_000_000_001, 2_000_000_002))
    assert os.readlink(backing / "link") == name
    assert (backing / "hard link").stat().st_ino == (backing / name).stat().st_ino
    seen = os.stat(mount / name)
    assert (seen.st_mode & 0o777, seen.st_nlink) == (0o600, 2)
    assert (seen.st_atime_ns, seen.st_mtime_ns) == (1_000_000_001, 2_000_000_002)
    assert (mount / "link").read_bytes() == b"through the mount"
    with pytest.raises(FileExistsError):
        os.open(mount / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert os.statvfs(mount).f_blocks == os.statvfs(backing).f_blocks


def test_a_checkpoint_is_written_fsynced_and_renamed_through_the_mount(
        faulty_mount: FaultyMount) -> None:
    folder = faulty_mount.path / "run 1"
    folder.mkdir()
    (folder / "latest.pt").write_bytes(b"old")
    with open(folder / "latest.pt", "rb") as reader:  # still reading the one replaced
        faulty_mount.calls()
        with open(folder / "latest.pt.tmp", "wb") as new:
            new.write(b"new" * 100_000)
            new.flush()
            os.fsync(new.fileno())
        os.replace(folder / "latest.pt.tmp", folder / "latest.pt")
        call_on_descriptor(folder, os.O_RDONLY | os.O_DIRECTORY, os.fsync)
        assert reader.read() == b"old"
    assert (faulty_mount.backing / "run 1" / "latest.pt").read_bytes() == b"new" * 100_000
    calls = faulty_mount.calls()
    for call in [("fsync", "run 1/latest.pt.tmp"), ("rename", "run 1/latest.pt.tmp"),
                 ("fsyncdir", "run 1")]:
        assert call in calls


def test_mmap_reads_through_the_mount(faulty_mount: FaultyMount) -> None:
    data = os.urandom(1_000_000)
    (faulty_mount.backing / "weights.bin").write_bytes(data)
    with open(faulty_mount.path / "weights.bin", "rb") as file, \
            mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data


def test_after_bytes_cuts_a_write_short_then_fails(faulty_mount: FaultyMount) -> None:
    faulty_mount.fail(errno.ENOSPC, ops="write", after_bytes=1000)
    fd = os.open(faulty_mount.path / "raw.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.write(fd, b"a" * 3000) == 1000
        with pytest.raises(OSError) as raised:
            os.write(fd, b"b")
        assert raised.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    assert (faulty_mount.backing / "raw.bin").read_bytes() == b"a" * 1000

    faulty_mount.heal()  # mid-file: the kernel sends 128 KiB a request
    faulty_mount.fail(errno.ENOSPC, ops="write", after_bytes=200_000)
    with pytest.raises(OSError) as raised, open(faulty_mount.path / "big.bin", "wb") as file:
        file.write(b"c" * 300_000)
    assert raised.value.errno == errno.ENOSPC
    assert (faulty_mount.backing / "big.bin").read_bytes() == b"c" * 200_000


def test_after_bytes_arms_a_fault_on_other_operations(faulty_mount: FaultyMount) -> None:
    faulty_mount.fail(errno.EIO, ops="fsync", after_bytes=100)
    with open(faulty_mount.path / "log.txt", "wb", buffering=0) as file:
        file.write(b"x" * 60)
        os.fsync(file.fileno())
        file.write(b"x" * 60)  # not cut short: the fault is not on writes
        with pytest.raises(OSError) as raised:
            os.fsync(file.fileno())
    assert raised.value.errno == errno.EIO
    assert (faulty_mount.backing / "log.txt").stat().st_size == 120


def test_times_fails_that_many_calls_then_heals(faulty_mount: FaultyMount) -> None:
    faulty_mount.fail(errno.EIO, ops="mkdir", times=2)
    for _ in range(2):
        with pytest.raises(OSError) as raised:
            os.mkdir(faulty_mount.path / "folder")
        assert raised.value.errno == errno.EIO
    os.mkdir(faulty_mount.path / "folder")
    assert (faulty_mount.backing / "folder").is_dir()


def test_a_fault_on_a_path_pattern_spares_the_others(faulty_mount: FaultyMount) -> None:
    mount = faulty_mount.path
    (mount / "checkpoints").mkdir()
    (mount / "checkpoints" / "old.pt").write_bytes(b"old")
    (mount / "outside.pt").write_bytes(b"outside")
    faulty_mount.fail(errno.EROFS, ops=CHANGING, path="checkpoints/*")
    refused = [lambda: (mount / "checkpoints" / "new.pt").write_bytes(b"new"),
               lambda: os.unlink(mount / "checkpoints" / "old.pt"),
               lambda: os.rename(mount / "outside.pt", mount / "checkpoints" / "moved.pt")]
    for change in refused:
        with pytest.raises(OSError) as raised:
            change()
        assert raised.value.errno == errno.EROFS
    assert (mount / "checkpoints" / "old.pt").read_bytes() == b"old"
    (mount / "elsewhere.pt").write_bytes(b"new")
    faulty_mount.heal()
    (mount / "checkpoints" / "new.pt").write_bytes(b"new")


def test_slow_makes_each_write_wait(faulty_mount: FaultyMount) -> None:
    faulty_mount.slow(0.2)
    fd = os.open(faulty_mount.path / "slow.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        started = time.monotonic()
        os.write(fd, b"x")
        assert time.monotonic() - started >= 0.2
    finally:
        os.close(fd)


def test_a_vanished_mount_is_not_connected_until_it_comes_back(
        faulty_mount: FaultyMount) -> None:
    mount = faulty_mount.path
    (mount / "data.bin").write_bytes(b"kept")
    held = os.open(mount / "data.bin", os.O_RDONLY)
    faulty_mount.fail(errno.EIO, ops="write")
    faulty_mount.vanish()
    accesses: list[Callable[[], object]] = [
        lambda: os.stat(mount), lambda: os.listdir(mount), lambda: os.stat(mount / "data.bin"),
        lambda: os.open(mount / "data.bin", os.O_RDONLY), lambda: os.read(held, 4)]
    for access in accesses:
        with pytest.raises(OSError) as raised:
            access()
        assert raised.value.errno == errno.ENOTCONN == 107
        assert raised.value.strerror == "Transport endpoint is not connected"
    with pytest.raises(OSError):
        os.close(held)  # its flush cannot reach the file system; the descriptor is gone
    with pytest.raises(RuntimeError, match=r"call come_back\(\) first"):
        faulty_mount.fail(errno.EIO)

    faulty_mount.come_back()
    assert (mount / "data.bin").read_bytes() == b"kept"
    (mount / "after.bin").write_bytes(b"new")  # the fault set before it vanished is gone
    assert (faulty_mount.backing / "after.bin").read_bytes() == b"new"


@pytest.mark.parametrize("lock", [fcntl.flock, fcntl.lockf], ids=["flock", "fcntl"])
def test_two_processes_take_turns_with_a_lock(faulty_mount: FaultyMount,
                                             lock: Callable[[object, int], None]) -> None:
    path = faulty_mount.path / "run.lock"
    path.write_bytes(b"")
    other = subprocess.Popen([sys.executable, "-c", LOCKER, str(path), lock.__name__],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    orders, answers = other.stdin, other.stdout
    assert orders is not None and answers is not None

    def tell(command: str) -> str:
        orders.write(command + "\n")
        orders.flush()
        return answers.readline().strip()

    with other, open(path, "r+") as mine:
        lock(mine, fcntl.LOCK_EX)
        assert tell("lock") == "busy"
        lock(mine, fcntl.LOCK_UN)
        assert tell("lock") == "locked"
        with pytest.raises(BlockingIOError):
            lock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert tell("unlock") == "unlocked"
        lock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        orders.close()
    assert other.returncode == 0


# Takes (lock) or gives back (unlock) the lock on argv[1] with fcntl.<argv[2]> at each line
# read, and says what happened.
LOCKER = """
import fcntl, sys
lock = getattr(fcntl, sys.argv[2])
with open(sys.argv[1], "r+") as file:
    for line in sys.stdin:
        if line.strip() == "unlock":
            lock(file, fcntl.LOCK_UN)
            print("unlocked", flush=True)
            continue
        try:
            lock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("locked", flush=True)
        except BlockingIOError:
            print("busy", flush=True)
"""


@pytest.mark.fuse
@pytest.mark.parametrize("vanish", [False, True], ids=["busy", "vanished"])
def test_no_mount_is_left_when_a_test_fails_midway(tmp_path: Path, vanish: bool) -> None:
    with pytest.raises(ZeroDivisionError), \
            mounted(tmp_path / "backing", tmp_path / "mount") as mount:
        busy = os.open(mount.path, os.O_RDONLY)  # the mount is in use as it goes
        if vanish:
            mount.vanish()
        1 / 0  # noqa: B018
    assert mount.path not in mount_points()
    assert not any(point.is_relative_to(tmp_path) for point in mount_points())
    os.close(busy)


@pytest.mark.fuse
def test_a_mount_goes_with_the_process_that_made_it(tmp_path: Path) -> None:
    tests = Path(__file__).parent
    maker = subprocess.Popen([sys.executable, "-c", MAKER, str(tests), str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    with maker:
        assert maker.stdout is not None
        control = Path(maker.stdout.readline().strip())
        assert tmp_path / "mount" in mount_points() and control.exists()
        maker.kill()
    wait_for(lambda: tmp_path / "mount" not in mount_points(), what="the orphan's unmount")
    wait_for(lambda: not control.parent.exists(), what="the removal of its control folder")


# Mounts tmp_path/"mount" (argv[2]), says where its control socket is, waits to be killed.
MAKER = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from faultfs import FaultyMount
base = Path(sys.argv[2])
(base / "backing").mkdir()
mount = FaultyMount(base / "backing", base / "mount")
mount.start()
print(mount._control, flush=True)
time.sleep(60)
"""


@pytest.mark.fuse
def test_a_full_disk_under_the_mount_gives_enospc_through_it(
        small_tmpfs: Callable[[int | str], Path], tmp_path: Path) -> None:
    disk = small_tmpfs("64k")
    assert os.statvfs(disk).f_blocks * os.statvfs(disk).f_frsize == 64 * 1024
    with pytest.raises(OSError) as raised:
        (disk / "big.bin").write_bytes(b"x" * 100_000)
    assert raised.value.errno == errno.ENOSPC
    os.unlink(disk / "big.bin")

    with mounted(disk / "backing", tmp_path / "drive") as drive:
        assert os.statvfs(drive.path).f_blocks == os.statvfs(disk).f_blocks
        with pytest.raises(OSError) as raised:
            (drive.path / "big.bin").write_bytes(b"x" * 100_000)
        assert raised.value.errno == errno.ENOSPC


def test_mistaken_arguments_are_refused_with_the_choices(faulty_mount: FaultyMount) -> None:
    with pytest.raises(ValueError, match="unknown operation class 'wirte'; choose from "
                                         "create, flush, fsync, link, listdir, mkdir"):
        faulty_mount.fail(errno.EIO, ops=["write", "wirte"])
    with pytest.raises(ValueError, match="times must be 1 or more, not 0"):
        faulty_mount.fail(errno.EIO, times=0)
    with pytest.raises(ValueError, match="after_bytes must be 0 or more, not -1"):
        faulty_mount.fail(errno.EIO, after_bytes=-1)
    with pytest.raises(ValueError, match=r"error must be an errno such as errno\.EIO, not 0"):
        faulty_mount.fail(0)
    with pytest.raises(RuntimeError, match="already mounted"):
        faulty_mount.start()
    with pytest.raises(ValueError, match="seconds_per_write must be >= 0"):
        faulty_mount.slow(-1)
    (faulty_mount.path / "still.txt").write_text("works")  # nothing was set


@pytest.mark.parametrize("size", [0, "1 GB", "-1m", "1.5m"])
def test_a_tmpfs_size_must_be_a_size(small_tmpfs: Callable[[int | str], Path],
                                     size: int | str) -> None:
    with pytest.raises(ValueError, match="size must be a number of bytes"):
        small_tmpfs(size)
