"""Reading zip and tar archives as one stream of members, in a single pass.

A tar (compressed or not) is read front to back once: each member's header, then its bytes,
never seeking back (see ``tar_stream``). A zip's central directory lists every member and
its declared size before any byte is read (``listed``). Read errors become one-line
ValueErrors.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ipycloud.runtime.messages import one_line
from ipycloud.runtime.storage.tar_stream import TarStream

_CHUNK = 1 << 20
_MAX_LINK_TEXT = 4096
_COMPRESSED_MAGIC = (
    (b"\x1f\x8b", "tar.gz"),
    (b"BZh", "tar.bz2"),
    (b"\xfd7zXZ\x00", "tar.xz"),
)
READ_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError,
    gzip.BadGzipFile, OSError, NotImplementedError, RuntimeError,
)


@dataclass(slots=True)
class Member:
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
    except READ_ERRORS:
        return False


class ArchiveSource(ABC):
    """Members of an archive and their bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @abstractmethod
    def members(self) -> Iterator[Member]:
        """Every member, in archive order, read as the iteration goes."""

    def listed(self) -> list[Member] | None:
        """Every member, known before any is read (zip); None when only reading tells."""
        return None

    @abstractmethod
    def chunks(self, member: Member) -> Iterator[bytes | memoryview]:
        """One regular member's bytes, in chunks (for a tar: of the member just yielded)."""

    def read_position(self) -> int | None:
        """How far into the archive file reading has gone, in bytes; None if unknown."""
        return None

    def filter_reason(self, member: Member, dest: Path) -> str | None:
        """A second opinion on a link from tarfile's data filter; None means no objection."""
        return None

    def corrupt(self, exc: BaseException) -> ValueError:
        return ValueError(f"{self.path}: corrupt or unreadable archive ({one_line(exc)})")


class _ZipSource(ArchiveSource):
    def __init__(self, path: Path, zf: zipfile.ZipFile) -> None:
        super().__init__(path)
        self.zf = zf
        self._members = [self._member(info) for info in zf.infolist()]

    def members(self) -> Iterator[Member]:
        return iter(self._members)

    def listed(self) -> list[Member]:
        return self._members

    def _member(self, info: zipfile.ZipInfo) -> Member:
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
        return Member(info.filename, kind, info.file_size, mode or 0o644, link, reason, info)

    def _link_text(self, info: zipfile.ZipInfo) -> str:
        if info.file_size > _MAX_LINK_TEXT:
            return "\x00"  # refused later as an invalid link target
        return self.zf.read(info).decode("utf-8", "replace")

    def chunks(self, member: Member) -> Iterator[bytes]:
        with self.zf.open(member.handle) as reader:
            while chunk := reader.read(_CHUNK):
                yield chunk


class _TarSource(ArchiveSource):
    def __init__(self, path: Path, raw: BinaryIO, stream: io.BufferedIOBase | BinaryIO) -> None:
        super().__init__(path)
        self.raw = raw  # the archive file, compressed or not
        self.tar = TarStream(stream)

    def members(self) -> Iterator[Member]:
        try:
            for info in self.tar:
                yield _tar_member(info)
        except READ_ERRORS as exc:  # raised here by reading: the consumer's errors stay there
            raise self.corrupt(exc) from exc

    def chunks(self, member: Member) -> Iterator[bytes | memoryview]:
        return self.tar.chunks(member.handle)

    def read_position(self) -> int:
        return self.raw.tell()

    def filter_reason(self, member: Member, dest: Path) -> str | None:
        data_filter = getattr(tarfile, "data_filter", None)
        if data_filter is None:
            return None
        try:
            data_filter(member.handle, str(dest))
        except tarfile.FilterError as exc:
            return f"tarfile data filter: {one_line(exc)}"
        return None


def _tar_member(info: tarfile.TarInfo) -> Member:
    """Our view of a TarInfo."""
    mode = stat.S_IMODE(info.mode)
    if info.isreg() and info.size >= 0:
        return Member(info.name, "file", info.size, mode, handle=info)
    if info.isdir():
        return Member(info.name, "dir", 0, mode, handle=info)
    if info.issym():
        return Member(info.name, "symlink", 0, mode, info.linkname, handle=info)
    if info.islnk():
        return Member(info.name, "hardlink", 0, mode, info.linkname, handle=info)
    reason = "device member" if info.ischr() or info.isblk() else "unsupported member type"
    if info.isfifo():
        reason = "FIFO member"
    if info.isreg():
        reason = f"negative size {info.size}"
    return Member(info.name, "special", 0, mode, reason=reason, handle=info)


def _decompressed(raw: BinaryIO, kind: str) -> io.BufferedIOBase | BinaryIO:
    """The tar stream inside the archive file ``raw`` of ``archive_kind``."""
    if kind == "tar.gz":
        return gzip.GzipFile(fileobj=raw)
    if kind == "tar.bz2":
        return bz2.BZ2File(raw)
    if kind == "tar.xz":
        return lzma.LZMAFile(raw)
    return raw


@contextmanager
def open_archive(path: Path, kind: str) -> Iterator[ArchiveSource]:
    """The archive (of ``archive_kind``) opened as an ArchiveSource, closed afterwards."""
    with ExitStack() as opened:
        raw = opened.enter_context(io.BufferedReader(io.FileIO(path), buffer_size=_CHUNK))
        source: ArchiveSource
        try:
            if kind == "zip":
                source = _ZipSource(path, opened.enter_context(zipfile.ZipFile(raw)))
            else:
                stream = _decompressed(raw, kind)
                opened.callback(stream.close)
                source = _TarSource(path, raw, stream)
        except READ_ERRORS as exc:
            raise ValueError(f"{path}: not a readable {kind} archive ({one_line(exc)})") from exc
        yield source
