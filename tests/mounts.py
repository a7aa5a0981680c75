"""Small tmpfs mounts, for storage faults with the kernel's own errors: a read-only folder and
a full disk. Mounting needs root (CAP_SYS_ADMIN); where it is not allowed, a test that asks
for one is skipped and says why. Such tests carry the ``mounts`` marker."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on ``folder`` (made here) with ``options``, unmounted on leaving."""
    folder.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                                 capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here: storage faults are tested on Linux as root")
    if mounted.returncode != 0:
        reason = " ".join(mounted.stderr.split()) or f"exit status {mounted.returncode}"
        pytest.skip(f"mounting a tmpfs is not allowed here ({reason}): storage faults are "
                    "tested as root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """An empty folder on a read-only file system."""
    with tmpfs(tmp_path / "read-only", "ro,size=1m") as folder:
        yield folder


@pytest.fixture
def full_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder on a file system of 64 KiB, where a larger file finds no space."""
    with tmpfs(tmp_path / "small disk", "size=64k") as folder:
        yield folder
