"""Listing a folder tree for sync: every entry's lstat by ``/``-separated relative path.

Files and links named like sync's temporary files (``durable.temp_name_for``) are also
listed apart: at the destination, those the source lacks are sync's own leftovers.
"""

from __future__ import annotations

import contextlib
import os
import stat

from ipycloud.runtime.durable import is_temporary, stale_temporary

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW

Listing = dict[str, os.stat_result]


def join(root: str, rel: str) -> str:
    """The path of ``rel`` (``/``-separated) under ``root``."""
    return f"{root}{os.sep}{rel}" if os.sep == "/" else os.path.join(root, *rel.split("/"))


def scan(root: str) -> tuple[Listing, list[str]]:
    """Every entry under ``root`` (links not followed) by relative path, parents before
    their children, and the relative paths of the files and links among them named like
    sync's temporary files.

    Folders are read through descriptors relative to ``root``, so each entry costs one
    short ``fstatat``. Entries that vanish while the tree is listed are left out; a
    missing ``root`` lists as empty.
    """
    found: Listing = {}
    temps: list[str] = []
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return found, temps
    try:
        pending = [""]
        while pending:
            prefix = pending.pop()
            _scan_folder(root_fd, prefix, found, temps, pending)
    finally:
        os.close(root_fd)
    return found, temps


def _scan_folder(root_fd: int, prefix: str, found: Listing, temps: list[str],
                 pending: list[str]) -> None:
    """Add one folder's entries (``prefix`` is its relative path plus ``/``, or empty)."""
    try:
        folder_fd = (os.open(prefix, _FOLDER_FLAGS, dir_fd=root_fd) if prefix
                     else os.dup(root_fd))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    try:
        with os.scandir(folder_fd) as entries:
            for entry in entries:
                rel = prefix + entry.name
                try:
                    info = found[rel] = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    pending.append(rel + "/")
                elif is_temporary(entry.name):
                    temps.append(rel)
    finally:
        os.close(folder_fd)


def kind(mode: int) -> str:
    """``dir``, ``file``, ``link`` or ``other`` (sockets, pipes, devices)."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "link" if stat.S_ISLNK(mode) else "other"


def take_leftovers(dst_entries: Listing, temps: list[str], src_entries: Listing) -> list[str]:
    """Sync's temporary files at the destination: those of ``temps`` (from ``scan``) that the
    source lacks, taken out of ``dst_entries``. One the source has is the user's file."""
    leftovers = [rel for rel in temps if rel not in src_entries]
    for rel in leftovers:
        del dst_entries[rel]
    return leftovers


def remove_stale_temps(root: str, temps: list[str]) -> None:
    """Delete the temporary files interrupted runs left (this process's, or dead ones')."""
    for rel in temps:
        if stale_temporary(rel.rsplit("/", 1)[-1]):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(join(root, rel))
