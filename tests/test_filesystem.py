"""File system facilities on real files: mount table parsing, whole-file-system flush,
kernel copies and their fallbacks."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from ipycloud.runtime.storage import filesystem

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:26 / /proc rw,nosuid - proc proc rw
41 22 0:35 / /content/drive rw,nosuid,nodev shared:9 - fuse.drive drive rw,user_id=0
42 22 0:36 / /mnt/my\\040disk rw master:3 - xfs /dev/sdb1 rw
43 22 0:37 / /storage rw - nfs4 server:/export rw
44 43 0:38 / /storage/cache rw - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(("path", "expected"), [
    ("/", "ext4"),
    ("/home/user/data", "ext4"),
    ("/content/drive/MyDrive/project", "fuse.drive"),
    ("/content/driveway", "ext4"),  # a sibling name, not inside the Drive mount
    ("/mnt/my disk/runs", "xfs"),  # \040 in the mount table is a space
    ("/storage/runs", "nfs4"),
    ("/storage/cache/x", "tmpfs"),  # the deeper mount wins
])
def test_the_file_system_holding_a_path_is_the_deepest_mount(path: str, expected: str) -> None:
    assert filesystem.filesystem_type(path, MOUNTINFO) == expected


def test_non_ascii_mount_points_are_kept_and_only_octal_escapes_decoded() -> None:
    line = "50 22 0:40 / /mnt/Données\\040d\u2019été\\134x rw - ext4 /dev/sdc1 rw\n"
    assert filesystem.parse_mountinfo(line) == [("/mnt/Données d\u2019été\\x", "ext4")]
    assert filesystem.filesystem_type("/mnt/Données d\u2019été\\x/runs", line) == "ext4"


def test_mount_table_lines_without_a_separator_are_ignored() -> None:
    assert filesystem.parse_mountinfo("garbage line with no separator at all\n") == []
    assert filesystem.filesystem_type("/x", "") is None


def test_only_local_block_file_systems_are_flushed_whole() -> None:
    assert "ext4" in filesystem.FLUSHED_WHOLE and "xfs" in filesystem.FLUSHED_WHOLE
    for remote in ("fuse.drive", "nfs4", "cifs", "fuse.gcsfuse"):
        assert remote not in filesystem.FLUSHED_WHOLE


def test_this_machines_test_folder_is_found_and_flushed(tmp_path: Path) -> None:
    kind = filesystem.filesystem_type(tmp_path)
    assert kind is not None and kind != "proc"
    if filesystem.can_flush_whole(tmp_path):
        (tmp_path / "f").write_bytes(b"data")
        filesystem.flush_filesystem(tmp_path)  # raises if syncfs failed
    with pytest.raises(OSError):
        filesystem.flush_filesystem(tmp_path / "missing")


def _pair(tmp_path: Path, data: bytes) -> tuple[int, int, Path]:
    source, target = tmp_path / "source", tmp_path / "target"
    source.write_bytes(data)
    reader = os.open(source, os.O_RDONLY)
    writer = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return reader, writer, target


def _copy(tmp_path: Path, data: bytes, size: int) -> tuple[int, list[int], bytes]:
    reader, writer, target = _pair(tmp_path, data)
    seen: list[int] = []
    try:
        copied = filesystem.copy_contents(reader, writer, size, seen.append)
    finally:
        os.close(reader)
        os.close(writer)
    return copied, seen, target.read_bytes()


DATA = random.Random(7).randbytes(3 * 1024 * 1024 + 17)


def test_kernel_copy_is_byte_exact_and_reports_progress(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filesystem, "_COPY_CHUNK", 1024 * 1024)
    copied, seen, result = _copy(tmp_path, DATA, len(DATA))
    assert copied == len(DATA) and result == DATA
    assert sum(seen) == len(DATA) and len(seen) == 4


def test_a_source_shorter_than_asked_stops_at_its_end(tmp_path: Path) -> None:
    copied, _, result = _copy(tmp_path, DATA[:1000], 5000)
    assert copied == 1000 and result == DATA[:1000]


@pytest.mark.parametrize("refused", [["copy_file_range"], ["copy_file_range", "sendfile"]])
def test_refused_kernel_copies_fall_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         refused: list[str]) -> None:
    """Across file systems copy_file_range says EXDEV, sendfile may say EINVAL: the copy
    carries on with the next way, from where the last one stopped."""
    calls: dict[str, int] = {}
    monkeypatch.setattr(filesystem, "_COPY_CHUNK", 1024 * 1024)
    for name in ("copy_file_range", "sendfile"):
        real = getattr(os, name)

        def step(*args: object, _name: str = name, _real: object = real) -> int:
            calls[_name] = calls.get(_name, 0) + 1
            # the first chunk goes through, then this way is refused
            if _name in refused and calls[_name] > 1:
                raise OSError(errno.EXDEV if _name == "copy_file_range" else errno.EINVAL,
                              "refused")
            return _real(*args)  # type: ignore[operator]

        monkeypatch.setattr(os, name, step)
    copied, _, result = _copy(tmp_path, DATA, len(DATA))
    assert copied == len(DATA) and result == DATA
    assert calls["copy_file_range"] == 2  # 4 chunks: one copied, then refused
    assert calls["sendfile"] == (2 if "sendfile" in refused else 3)


def test_other_copy_errors_are_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "copy_file_range", full_disk)
    with pytest.raises(OSError, match="No space left"):
        _copy(tmp_path, DATA, len(DATA))
