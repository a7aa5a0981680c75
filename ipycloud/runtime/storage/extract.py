"""Safe extraction of zip and tar archives into a folder.

Every member is checked before it is written, and nothing is written through a link:

- refused: absolute names, drive letters (``C:``), ``..`` that climbs above the target
  (backslashes in names count as separators), NUL bytes, device / FIFO / other special
  members, encrypted zip entries, symlinks that are absolute or resolve outside the archive's
  own tree, hard links to anything but a regular file extracted earlier from the same archive,
  members that would pass through a symlink or a file (also on the way to a ``..``), and
  members under a refused link.
- on tar, ``tarfile.data_filter`` (where Python has it) judges every link as a second
  opinion; our own checks stand without it. On a regular file or folder it could only
  object to what the checks above refuse (it resolves the name with ``realpath`` in a target
  that holds no link the name may pass through), at the cost of two ``realpath`` walks a
  member, so it is not asked. tarfile never writes anything: we copy the bytes ourselves.
- size: by default the files may take what the target's file system has free, less a
  margin, and no more members than it has free inodes (see ``expansion``);
  ``max_total_bytes`` replaces that with a limit on the files' bytes. A zip's declared
  sizes are checked before anything is written, a tar member's before its bytes are, and
  a member whose bytes outgrow its declared size is stopped.
- modes: files keep ``mode & 0o777`` (no setuid / setgid / sticky); folders get
  ``(mode & 0o777) | 0o700`` so the owner can always manage them.

The archive is read once, front to back, and the writer keeps its own account of what it
made in the fresh temporary folder, so no member costs a ``stat`` of the folders above it;
every file is still created with ``O_EXCL | O_NOFOLLOW``.

Atomicity: members are written into a temporary folder made inside the target's parent
(same filesystem). When ``target`` does not exist, that folder is renamed to ``target`` in
one step. When it exists, the two trees are merged: a clash (a file where a folder is, a
link where a folder is) is found before anything moves and raises ValueError; then new
folders are renamed in whole and files are renamed into place one by one, replacing
existing files atomically. Existing entries not in the archive are kept. An error or
KeyboardInterrupt before the merge leaves ``target`` untouched; every name in ``target``
always holds either its old or its complete new content. The temporary folder is always
removed.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from ipycloud.runtime.storage.archive import (
    READ_ERRORS,
    ArchiveSource,
    Member,
    archive_kind,
    open_archive,
)
from ipycloud.runtime.storage.errors import StorageError
from ipycloud.runtime.storage.expansion import Budget, ExpansionLimit
from ipycloud.runtime.units import counted

__all__ = ["ExtractReport", "UnsafeArchiveError", "archive_kind", "extract"]

_CREATE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
           | getattr(os, "O_CLOEXEC", 0))


@dataclass(frozen=True)
class ExtractReport:
    """What an extraction did: where, how many files written, which members refused."""

    target: Path
    extracted: int
    refused: tuple[str, ...]


class UnsafeArchiveError(StorageError):
    """Raised by ``extract(strict=True)`` when a member was refused."""

    def __init__(self, archive: Path, refused: tuple[str, ...]) -> None:
        super().__init__(f"{archive}: refused {counted(len(refused), 'unsafe member')}: "
                         f"{refused[0]}")
        self.refused = refused


class _Refused(Exception):
    """A member is not extracted; the message is the reason."""


# ---------------------------------------------------------------- name checks


def _parts(name: str) -> tuple[str, ...]:
    """The member's path inside the target, as components; raises _Refused if unsafe."""
    if "\x00" in name:
        raise _Refused("NUL byte in name")
    text = name.replace("\\", "/")
    if len(text) >= 2 and text[1] == ":" and text[0].isalpha():
        raise _Refused("drive letter in name")
    if text.startswith("/"):
        raise _Refused("absolute path")
    plain = text.split("/")
    if "" not in plain and "." not in plain and ".." not in plain:
        return tuple(plain)  # nothing to apply: the common case
    parts = _follow((), text)
    if parts is None:
        raise _Refused("'..' escapes the target")
    return parts


def _follow(start: tuple[str, ...], path: str) -> tuple[str, ...] | None:
    """The components reached by following the relative ``/``-separated ``path`` from
    ``start`` (``.`` and ``..`` applied); None where ``..`` climbs above the target."""
    parts = list(start)
    for part in path.split("/"):
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return tuple(parts)


def _check_symlink(parts: tuple[str, ...], target: str) -> None:
    """Refuse a symlink whose target is absolute or climbs out of the archive's tree."""
    if not target or "\x00" in target or "\\" in target:
        raise _Refused("symlink with an empty or invalid target")
    if target.startswith("/") or (len(target) >= 2 and target[1] == ":"):
        raise _Refused(f"symlink to absolute path {target!r}")
    if _follow(parts[:-1], target) is None:
        raise _Refused(f"symlink {target!r} points outside the target")


def _static_check(member: Member, source: ArchiveSource, dest: Path) -> tuple[str, ...]:
    """Checks that need nothing written (tarfile's data filter judging a link as
    extracted into ``dest`` included); the member's path components."""
    if member.kind == "special":
        raise _Refused(member.reason)
    parts = _parts(member.name)
    if not parts and member.kind != "dir":
        raise _Refused("empty name")
    if member.kind == "symlink":
        _check_symlink(parts, member.linkname)
    if member.kind == "hardlink":
        try:
            _parts(member.linkname)
        except _Refused as exc:
            raise _Refused(f"hard link outside the target: {exc}") from None
    if member.kind in ("symlink", "hardlink") and (reason := source.filter_reason(member, dest)):
        raise _Refused(reason)
    return parts


# ---------------------------------------------------------------- writing


def _copy_stream(source: ArchiveSource, member: Member, fd: int) -> None:
    """Write a member's bytes into the file ``fd``; a member outgrowing its declared size
    is stopped. Only reading errors speak of a corrupt archive."""
    written = 0
    try:
        chunks = source.chunks(member)
    except READ_ERRORS as exc:
        raise source.corrupt(exc) from exc
    while True:
        try:
            chunk = next(chunks, None)
        except READ_ERRORS as exc:
            raise source.corrupt(exc) from exc
        if chunk is None:
            return
        written += len(chunk)
        if written > member.size:
            raise ValueError(f"{source.path}: {member.name} holds more bytes than the "
                             f"{member.size} it declares")
        while chunk:
            chunk = chunk[os.write(fd, chunk):]


class _Writer:
    """Writes checked members into a fresh temporary folder ``root``.

    ``made`` records what the writer created there ("dir", "file" or "link" by path
    components): nothing else writes in that private folder, so it stands in for an
    ``lstat`` of each folder on a member's way.
    """

    def __init__(self, source: ArchiveSource, root: Path, budget: Budget) -> None:
        self.source = source
        self.root = root
        self.budget = budget
        self.made: dict[tuple[str, ...], str] = {(): "dir"}
        self.dir_modes: dict[str, int] = {}
        self.links: list[tuple[str, str]] = []
        self.refused_links: list[tuple[str, ...]] = []
        self.refused: list[str] = []
        self.written = 0
        self.last_folder: tuple[tuple[str, ...], str] = ((), str(root))
        self.umask = _process_umask()

    def add(self, member: Member) -> None:
        """Write one member, or record why it was refused."""
        try:
            parts = _static_check(member, self.source, self.root)
            if ".." in member.name:
                self._check_walk(member.name)
            if self.refused_links:
                self._check_under_refused(parts)
            self._write(member, parts)
        except _Refused as exc:
            self.refused.append(f"{member.name}: {exc}")
            if member.kind in ("symlink", "hardlink"):
                self._remember_refused_link(member)

    def _remember_refused_link(self, member: Member) -> None:
        with suppress(_Refused):
            self.refused_links.append(_parts(member.name))

    def _check_under_refused(self, parts: tuple[str, ...]) -> None:
        for link in self.refused_links:
            if link and parts[: len(link)] == link:
                raise _Refused(f"under refused link {'/'.join(link)!r}")

    def _check_walk(self, name: str) -> None:
        """Refuse a name whose ``..`` would be taken after a link made earlier."""
        here: list[str] = []
        for part in name.replace("\\", "/").split("/"):
            if self.made.get(tuple(here)) == "link":
                raise _Refused(f"path passes through symlink {here[-1]!r}")
            if part == "..":
                here.pop()
            elif part not in ("", "."):
                here.append(part)

    def _write(self, member: Member, parts: tuple[str, ...]) -> None:
        if not parts:
            return  # the archive's root folder ("./")
        dest = f"{self._folder(parts[:-1])}/{parts[-1]}"
        if member.kind == "dir":
            self._make_dir(parts, dest, member.mode)
            return
        source = self._link_source(member) if member.kind == "hardlink" else ""
        if self.made.get(parts) == "dir":
            raise _Refused("conflicts with a folder of the same name")
        self.budget.charge(member.size if member.kind == "file" else 0)
        if self.made.pop(parts, None) is not None:
            os.unlink(dest)  # an earlier member of the same name
        if member.kind == "file":
            self._write_file(member, dest)
        elif member.kind == "symlink":
            os.symlink(member.linkname, dest)
            self.links.append((member.name, dest))
        else:
            os.link(source, dest, follow_symlinks=False)
        self.made[parts] = "link" if member.kind == "symlink" else "file"
        self.written += 1

    def _folder(self, parts: tuple[str, ...]) -> str:
        """The folder ``parts`` in ``root``, made as needed, never through a link or file."""
        known, path = self.last_folder
        if parts == known:
            return path
        path = str(self.root)
        for depth, part in enumerate(parts, 1):
            path = f"{path}/{part}"
            kind = self.made.get(parts[:depth])
            if kind is None:
                self.budget.charge(0)
                os.mkdir(path, 0o700)
                self.made[parts[:depth]] = "dir"
                self.dir_modes.setdefault(path, 0o755)
            elif kind == "link":
                raise _Refused(f"path passes through symlink {part!r}")
            elif kind == "file":
                raise _Refused(f"path passes through file {part!r}")
        self.last_folder = (parts, path)
        return path

    def _make_dir(self, parts: tuple[str, ...], dest: str, mode: int) -> None:
        kind = self.made.get(parts)
        if kind is None:
            self.budget.charge(0)
            os.mkdir(dest, 0o700)
        elif kind != "dir":
            os.unlink(dest)
            os.mkdir(dest, 0o700)
        self.made[parts] = "dir"
        self.dir_modes[dest] = (mode & 0o777) | 0o700

    def _write_file(self, member: Member, dest: str) -> None:
        mode = member.mode & 0o777
        fd = os.open(dest, _CREATE, mode)  # in a folder only we can enter
        try:
            _copy_stream(self.source, member, fd)
            if self.umask is None or mode & self.umask:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def _link_source(self, member: Member) -> str:
        """The file a hard link names: a regular file this archive put in ``root``."""
        parts = _parts(member.linkname)
        if self.made.get(parts) != "file":
            raise _Refused("hard link to a member not extracted as a regular file")
        return os.path.join(self.root, *parts)

    def finish(self) -> None:
        """Drop symlinks that really resolve outside ``root``; set folder modes."""
        real_root = os.path.realpath(self.root)
        for name, link in self.links:
            if os.path.lexists(link) and not _inside(os.path.realpath(link), real_root):
                os.unlink(link)
                self.written -= 1
                self.refused.append(f"{name}: symlink resolves outside the target")
        for folder, mode in self.dir_modes.items():
            os.chmod(folder, mode)


def _process_umask() -> int | None:
    """The process's umask as Linux shows it (read, never set: other threads create files
    too); None where unknown."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class _Progress:
    """A progress bar over a zip's members, or over a tar archive's bytes as read; moved
    every ``_EVERY`` members (a refusal shows at once), so a member costs a count."""

    _EVERY = 64

    def __init__(self, source: ArchiveSource, count: int | None, enabled: bool) -> None:
        from tqdm.auto import tqdm

        self.source = source
        self.by_bytes = count is None
        self.pending = 0
        self.shown_refusals = 0
        self.bar = tqdm(total=source.path.stat().st_size if count is None else count,
                        unit="B" if self.by_bytes else "member", unit_scale=self.by_bytes,
                        unit_divisor=1024, desc=f"extract {source.path.name}",
                        disable=not enabled)

    def step(self, refused: list[str]) -> None:
        """One member done; ``refused`` so far."""
        self.pending += 1
        if len(refused) != self.shown_refusals:
            self.shown_refusals = len(refused)
            self.bar.set_postfix_str(f"refused {len(refused)}: {refused[-1]}", refresh=False)
        elif self.pending < self._EVERY:
            return
        self.flush()

    def flush(self) -> None:
        done, self.pending = self.pending, 0
        if self.bar.disable:
            return
        position = self.source.read_position() if self.by_bytes else None
        self.bar.update(done if position is None else position - self.bar.n)

    def close(self) -> None:
        self.flush()
        self.bar.close()


# ---------------------------------------------------------------- installing


def _merge_plan(src: Path, dest: Path, moves: list[tuple[Path, Path]]) -> None:
    """Collect (from, to) renames merging ``src`` into ``dest``; ValueError on a clash."""
    for entry in os.scandir(src):
        to = dest / entry.name
        try:
            to_mode: int | None = os.lstat(to).st_mode
        except FileNotFoundError:
            to_mode = None
        src_is_dir = entry.is_dir(follow_symlinks=False)
        if to_mode is None:
            moves.append((Path(entry.path), to))
        elif src_is_dir and stat.S_ISDIR(to_mode):
            _merge_plan(Path(entry.path), to, moves)
        elif src_is_dir or stat.S_ISDIR(to_mode):
            raise ValueError(f"{to}: exists and clashes with the archive (file vs folder)")
        else:
            moves.append((Path(entry.path), to))


def _install(tmp: Path, target: Path) -> None:
    """Move the extracted tree into ``target``: one rename, or a checked merge."""
    if not os.path.lexists(target):
        os.chmod(tmp, 0o755)
        os.rename(tmp, target)
        return
    if not target.is_dir():
        raise ValueError(f"{target}: exists and is not a folder")
    moves: list[tuple[Path, Path]] = []
    _merge_plan(tmp, target, moves)
    for src, to in moves:
        os.replace(src, to)


def _limit(max_total_bytes: int | None, folder: Path) -> ExpansionLimit:
    """The caller's limit, else the free space of ``folder``'s file system."""
    if max_total_bytes is None:
        return ExpansionLimit.free_space(folder)
    return ExpansionLimit.given(max_total_bytes)


def _check_declared(listed: list[Member] | None, budget: Budget) -> None:
    """Charge every member a listing declares, before anything is written."""
    for member in listed or ():
        budget.charge(member.size if member.kind == "file" else 0)


def _write_all(source: ArchiveSource, tmp: Path, budget: Budget, *, strict: bool,
               progress: bool) -> _Writer:
    """Write every member into ``tmp`` in one pass; in strict mode stop at a refusal."""
    writer = _Writer(source, tmp, budget)
    listed = source.listed()
    bar = _Progress(source, None if listed is None else len(listed), progress)
    try:
        for member in source.members():
            writer.add(member)
            if strict and writer.refused:
                raise UnsafeArchiveError(source.path, tuple(writer.refused))
            bar.step(writer.refused)
        writer.finish()
    finally:
        bar.close()
    if strict and writer.refused:
        raise UnsafeArchiveError(source.path, tuple(writer.refused))
    return writer


def extract(
    archive: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    strict: bool = False,
    progress: bool = True,
    max_total_bytes: int | None = None,
) -> ExtractReport:
    """Extract a zip / tar(.gz/.bz2/.xz) archive safely into ``target`` (merging if it exists).

    Unsafe members are skipped and listed in the report; with ``strict`` the first refusal
    raises UnsafeArchiveError and ``target`` is left untouched. By default the archive may
    take the free space of the target's file system less a margin; ``max_total_bytes``
    limits the files' bytes instead. ValueError for an unknown or corrupt archive, or one
    that would expand past the limit (``target`` untouched).
    """
    path = Path(archive)
    dest = Path(os.path.abspath(target))
    kind = archive_kind(path)
    if kind is None:
        raise ValueError(f"{path}: not a zip or tar (.gz, .bz2, .xz) archive, or corrupt")
    with open_archive(path, kind) as source:
        dest.parent.mkdir(parents=True, exist_ok=True)
        limit = _limit(max_total_bytes, dest.parent)
        _check_declared(source.listed(), Budget(path, limit))
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.extract-", dir=dest.parent))
        try:
            writer = _write_all(source, tmp, Budget(path, limit), strict=strict,
                                progress=progress)
            _install(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return ExtractReport(dest, writer.written, tuple(writer.refused))
