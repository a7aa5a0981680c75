"""Fake cgroup trees under a folder, laid out as the kernel shows them in /proc and /sys."""

from __future__ import annotations

from pathlib import Path


def write(root: Path, relative: str, content: str | bytes) -> None:
    """Create ``root/relative`` with ``content``, making its parent folders."""
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def make_v2(root: Path, files: dict[str, str | bytes], self_path: str = "/") -> None:
    """A cgroup v2 mount with the process in ``self_path``; ``files`` are relative to the mount."""
    write(root, "proc/self/cgroup", f"0::{self_path}\n")
    write(root, "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
    for relative, content in files.items():
        write(root, f"sys/fs/cgroup/{relative}", content)


def make_v1(root: Path, self_cgroup: str, files: dict[str, str]) -> None:
    """A cgroup v1 hierarchy; ``files`` are relative to /sys/fs/cgroup."""
    write(root, "proc/self/cgroup", self_cgroup)
    for relative, content in files.items():
        write(root, f"sys/fs/cgroup/{relative}", content)
