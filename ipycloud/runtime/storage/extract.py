"""Safe extraction of zip and tar archives into a folder.

Every member is checked before it is written, and nothing is written through a link:

- refused: absolute names, drive letters (``C:``), ``..`` that climbs above the target
  (backslashes in names count as separators), NUL bytes, device / FIFO / other special
  members, encrypted zip entries, symlinks that are absolute or resolve outside the archive's
  own tree, hard links to anything but a regular file extracted earlier from the same archive,
  members that would pass through a symlink or a file, and members under a refused link.
- on tar, ``tarfile.data_filter`` (where Python has it) runs as a second check; our own
  checks stand without it. tarfile never writes anything: we copy the bytes ourselves.
- modes: files keep ``mode & 0o777`` (no setuid / setgid / sticky); folders get
  ``(mode & 0o777) | 0o700`` so the owner can always manage them.

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

import gzip
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ipycloud.runtime.messages import one_line

__all__ = ["ExtractReport", "UnsafeArchiveError", "archive_kind", "extract"]

_CHUNK = 1 << 20
_MAX_LINK_TEXT = 4096
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_COMPRESSED_MAGIC = (
    (b"\x1f\x8b", "tar.gz"),
    (b"BZh", "tar.bz2"),
    (b"\xfd7zXZ\x00", "tar.xz"),
)
_READ_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError,
    gzip.BadGzipFile, OSError, NotImplementedError, RuntimeError,
)


@dataclass(frozen=True)
class ExtractReport:
    """What an extraction did: where, how many files written, which members refused."""

    target: Path
    extracted: int
    refused: tuple[str, ...]


class UnsafeArchiveError(Exception):
    """Raised by ``extract(strict=True)`` when any member was refused."""

    def __init__(self, archive: Path, refused: tuple[str, ...]) -> None:
        super().__init__(f"{archive}: refused {len(refused)} unsafe member(s): {refused[0]}")
        self.refused = refused


class _Refused(Exception):
    """A member is not extracted; the message is the reason."""


@dataclass
class _Member:
    """One archive member, whatever the format."""

    name: str
    kind: str  # "file", "dir", "symlink", "hardlink" or "special"
    size: int
    mode: int
    linkname: str = ""
    reason: str = ""  # why a "special" member is refused
    handle: Any = field(default=None, repr=False)


def archive_kind(path: str | os.PathLike[str]) -> str | None:
    """"zip", "tar", "tar.gz", "tar.bz2" or "tar.xz", judged by content; None otherwise."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(512)
    except OSError:
        return None
    if head[257:262] == b"ustar":
        return "tar" if _is_tar(p) else None
    for magic, kind in _COMPRESSED_MAGIC:
        if head.startswith(magic):
            return kind if _is_tar(p) else None
    if zipfile.is_zipfile(p):
        return "zip"
    return "tar" if _is_tar(p) else None


def _is_tar(path: Path) -> bool:
    """tarfile.is_tarfile, False on any error."""
    try:
        return tarfile.is_tarfile(path)
    except _READ_ERRORS:
        return False


# ---------------------------------------------------------------- archive sources


class _Source(ABC):
    """Members of an archive and their bytes; read errors become one-line ValueErrors."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @abstractmethod
    def members(self) -> list[_Member]:
        """Every member, in archive order."""

    @abstractmethod
    def open(self, member: _Member) -> IO[bytes]:
        """A reader of one regular member's bytes."""

    def filter_reason(self, member: _Member, dest: Path) -> str | None:
        """A second opinion from tarfile's data filter; None means no objection."""
        return None

    def corrupt(self, exc: BaseException) -> ValueError:
        return ValueError(f"{self.path}: corrupt or unreadable archive ({one_line(exc)})")


class _ZipSource(_Source):
    def __init__(self, path: Path, zf: zipfile.ZipFile) -> None:
        super().__init__(path)
        self.zf = zf

    def members(self) -> list[_Member]:
        return [self._member(info) for info in self.zf.infolist()]

    def _member(self, info: zipfile.ZipInfo) -> _Member:
        unix = info.external_attr >> 16
        mode = stat.S_IMODE(unix)
        kind, reason, link = "file", "", ""
        if info.flag_bits & 0x1:
            kind, reason = "special", "encrypted member"
        elif info.is_dir() or stat.S_ISDIR(unix):
            kind, mode = "dir", mode or 0o755
        elif stat.S_ISLNK(unix):
            kind, link = "symlink", self._link_text(info)
        elif stat.S_IFMT(unix) not in (0, stat.S_IFREG):
            kind, reason = "special", "device, FIFO or socket member"
        return _Member(info.filename, kind, info.file_size, mode or 0o644, link, reason, info)

    def _link_text(self, info: zipfile.ZipInfo) -> str:
        if info.file_size > _MAX_LINK_TEXT:
            return "\x00"  # refused later as an invalid link target
        return self.zf.read(info).decode("utf-8", "replace")

    def open(self, member: _Member) -> IO[bytes]:
        return self.zf.open(member.handle)


class _TarSource(_Source):
    def __init__(self, path: Path, tf: tarfile.TarFile) -> None:
        super().__init__(path)
        self.tf = tf

    def members(self) -> list[_Member]:
        return [_tar_member(info) for info in self.tf.getmembers()]

    def open(self, member: _Member) -> IO[bytes]:
        handle = self.tf.extractfile(member.handle)
        if handle is None:
            raise tarfile.ReadError(f"no data for {member.name}")
        return handle

    def filter_reason(self, member: _Member, dest: Path) -> str | None:
        data_filter = getattr(tarfile, "data_filter", None)
        if data_filter is None:
            return None
        try:
            data_filter(member.handle, str(dest))
        except tarfile.FilterError as exc:
            return f"tarfile data filter: {one_line(exc)}"
        return None


def _tar_member(info: tarfile.TarInfo) -> _Member:
    """Our view of a TarInfo."""
    mode = stat.S_IMODE(info.mode)
    if info.isreg():
        return _Member(info.name, "file", info.size, mode, handle=info)
    if info.isdir():
        return _Member(info.name, "dir", 0, mode, handle=info)
    if info.issym():
        return _Member(info.name, "symlink", 0, mode, info.linkname, handle=info)
    if info.islnk():
        return _Member(info.name, "hardlink", 0, mode, info.linkname, handle=info)
    reason = "device member" if info.ischr() or info.isblk() else "unsupported member type"
    if info.isfifo():
        reason = "FIFO member"
    return _Member(info.name, "special", 0, mode, reason=reason, handle=info)


@contextmanager
def _open_source(path: Path, kind: str) -> Iterator[_Source]:
    """The archive opened as a _Source, closed afterwards."""
    try:
        archive: zipfile.ZipFile | tarfile.TarFile = (
            zipfile.ZipFile(path) if kind == "zip" else tarfile.open(path, "r:*")  # noqa: SIM115
        )
    except _READ_ERRORS as exc:
        raise ValueError(f"{path}: not a readable {kind} archive ({one_line(exc)})") from exc
    with archive:
        if isinstance(archive, zipfile.ZipFile):
            yield _ZipSource(path, archive)
        else:
            yield _TarSource(path, archive)



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


def _static_check(member: _Member, source: _Source, dest: Path) -> tuple[str, ...]:
    """Checks that need nothing written (tarfile's data filter judging the member as
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
    reason = source.filter_reason(member, dest)
    if reason:
        raise _Refused(reason)
    return parts


# ---------------------------------------------------------------- writing


def _copy_stream(src: IO[bytes], out: IO[bytes], budget: _Budget) -> None:
    """Copy ``src`` into ``out`` in chunks, counting bytes against the budget."""
    while True:
        try:
            chunk = src.read(_CHUNK)
        except _READ_ERRORS as exc:
            raise budget.source.corrupt(exc) from exc
        if not chunk:
            return
        budget.spend(len(chunk))
        out.write(chunk)


@dataclass
class _Budget:
    """Bytes written so far against ``max_total_bytes``."""

    source: _Source
    limit: int | None
    used: int = 0

    def spend(self, n: int) -> None:
        self.used += n
        if self.limit is not None and self.used > self.limit:
            raise ValueError(f"{self.source.path}: more than {self.limit} bytes uncompressed")


class _Writer:
    """Writes checked members into a fresh temporary folder ``root``."""

    def __init__(self, source: _Source, root: Path, budget: _Budget) -> None:
        self.source = source
        self.root = root
        self.budget = budget
        self.dir_modes: dict[Path, int] = {}
        self.files: set[tuple[str, ...]] = set()
        self.links: list[tuple[str, Path]] = []
        self.refused_links: list[tuple[str, ...]] = []
        self.refused: list[str] = []
        self.written = 0

    def add(self, member: _Member) -> None:
        """Write one member, or record why it was refused."""
        try:
            parts = _static_check(member, self.source, self.root)
            self._check_under_refused(parts)
            self._write(member, parts)
        except _Refused as exc:
            self.refused.append(f"{member.name}: {exc}")
            if member.kind in ("symlink", "hardlink"):
                self._remember_refused_link(member)

    def _remember_refused_link(self, member: _Member) -> None:
        with suppress(_Refused):
            self.refused_links.append(_parts(member.name))

    def _check_under_refused(self, parts: tuple[str, ...]) -> None:
        for link in self.refused_links:
            if link and parts[: len(link)] == link:
                raise _Refused(f"under refused link {'/'.join(link)!r}")

    def _write(self, member: _Member, parts: tuple[str, ...]) -> None:
        if not parts:
            return  # the archive's root folder ("./")
        dest = self._parent(parts) / parts[-1]
        if member.kind == "dir":
            self._make_dir(dest, member.mode)
            return
        self._clear(dest)
        self.files.discard(parts)
        if member.kind == "file":
            self._write_file(member, dest)
            self.files.add(parts)
        elif member.kind == "symlink":
            os.symlink(member.linkname, dest)
            self.links.append((member.name, dest))
        else:
            self._hard_link(member, dest)
            self.files.add(parts)
        self.written += 1

    def _parent(self, parts: tuple[str, ...]) -> Path:
        """The member's folder in ``root``, made as needed, never through a link or file."""
        here = self.root
        for part in parts[:-1]:
            here = here / part
            try:
                mode = os.lstat(here).st_mode
            except FileNotFoundError:
                os.mkdir(here, 0o700)
                self.dir_modes.setdefault(here, 0o755)
                continue
            if stat.S_ISLNK(mode):
                raise _Refused(f"path passes through symlink {part!r}")
            if not stat.S_ISDIR(mode):
                raise _Refused(f"path passes through file {part!r}")
        return here

    def _make_dir(self, dest: Path, mode: int) -> None:
        try:
            st_mode = os.lstat(dest).st_mode
        except FileNotFoundError:
            os.mkdir(dest, 0o700)
        else:
            if not stat.S_ISDIR(st_mode):
                os.unlink(dest)
                os.mkdir(dest, 0o700)
        self.dir_modes[dest] = (mode & 0o777) | 0o700

    def _clear(self, dest: Path) -> None:
        """Remove an earlier member of the same name; a folder is never replaced."""
        try:
            st_mode = os.lstat(dest).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st_mode):
            raise _Refused("conflicts with a folder of the same name")
        os.unlink(dest)

    def _write_file(self, member: _Member, dest: Path) -> None:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            try:
                src = self.source.open(member)
            except _READ_ERRORS as exc:
                raise self.source.corrupt(exc) from exc
            with src:
                _copy_stream(src, out, self.budget)
            os.fchmod(out.fileno(), member.mode & 0o777)

    def _hard_link(self, member: _Member, dest: Path) -> None:
        parts = _parts(member.linkname)
        if parts not in self.files:
            raise _Refused("hard link to a member not extracted as a regular file")
        os.link(self.root.joinpath(*parts), dest, follow_symlinks=False)

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


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


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


def _check_size(members: list[_Member], limit: int | None, path: Path) -> None:
    if limit is None:
        return
    total = sum(m.size for m in members if m.kind == "file")
    if total > limit:
        raise ValueError(f"{path}: declares {total} bytes uncompressed, over the {limit} limit")


def _static_refusals(members: list[_Member], source: _Source, target: Path) -> list[str]:
    """Refusals known without writing anything (for strict mode)."""
    refused = []
    for member in members:
        try:
            _static_check(member, source, target)
        except _Refused as exc:
            refused.append(f"{member.name}: {exc}")
    return refused


def _write_all(source: _Source, members: list[_Member], tmp: Path, budget: _Budget,
               progress: bool) -> _Writer:
    """Write every member into ``tmp``, with a progress bar when asked."""
    from tqdm.auto import tqdm

    writer = _Writer(source, tmp, budget)
    with tqdm(total=len(members), unit="member", desc=f"extract {source.path.name}",
              disable=not progress) as bar:
        for member in members:
            writer.add(member)
            if writer.refused:
                bar.set_postfix_str(f"refused {len(writer.refused)}: {writer.refused[-1]}",
                                    refresh=False)
            bar.update(1)
        writer.finish()
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

    Unsafe members are skipped and listed in the report; with ``strict`` any refusal raises
    UnsafeArchiveError and ``target`` is left untouched. ValueError for an unknown or
    corrupt archive, or when declared sizes exceed ``max_total_bytes``.
    """
    path = Path(archive)
    dest = Path(os.path.abspath(target))
    kind = archive_kind(path)
    if kind is None:
        raise ValueError(f"{path}: not a zip or tar (.gz, .bz2, .xz) archive, or corrupt")
    with _open_source(path, kind) as source:
        try:
            members = source.members()
        except _READ_ERRORS as exc:
            raise source.corrupt(exc) from exc
        _check_size(members, max_total_bytes, path)
        if strict and (early := _static_refusals(members, source, dest)):
            raise UnsafeArchiveError(path, tuple(early))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.extract-", dir=dest.parent))
        try:
            writer = _write_all(source, members, tmp, _Budget(source, max_total_bytes),
                                progress)
            if strict and writer.refused:
                raise UnsafeArchiveError(path, tuple(writer.refused))
            _install(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return ExtractReport(dest, writer.written, tuple(writer.refused))
