"""Reading zip and tar archives as one stream of members, in a single pass.

A tar (compressed or not) is read front to back once: each member's header, then its bytes,
never seeking back. tarfile reads the headers (long names, pax records, sparse maps); the
512-byte header blocks themselves are decoded by ``_TarHeader``, a faster equivalent of
tarfile's own decoding that hands it every block out of the ordinary. A zip's central
directory lists every member and its declared size before any byte is read (``listed``).
Read errors become one-line ValueErrors.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import struct
import tarfile
import zipfile
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.messages import one_line

_CHUNK = 1 << 20
_MAX_LINK_TEXT = 4096
_BLOCK = tarfile.BLOCKSIZE
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


class _TarHeader(tarfile.TarInfo):
    """A TarInfo decoded from a plain header block in a third of tarfile's time.

    tarfile takes this class through its documented ``tarinfo`` argument. A block with
    octal numbers, a name, a checksum that unsigned arithmetic matches and no old-GNU
    sparse map is decoded here, field by field as tarfile does; any other block (an
    end-of-archive block, base-256 numbers, a bad or signed checksum, a sparse map) goes to
    tarfile's own decoding, which accepts or rejects it.
    """

    __slots__ = ()
    _LAYOUT = struct.Struct("100s8s8s8s12s12s8sc100s8x32s32s8s8s155s12x")

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> _TarHeader:
        if len(buf) != _BLOCK or not buf[0] or buf[156:157] == tarfile.GNUTYPE_SPARSE:
            return super().frombuf(buf, encoding, errors)
        (name, mode, uid, gid, size, mtime, chksum, kind, linkname, uname, gname,
         major, minor, prefix) = cls._LAYOUT.unpack(buf)
        try:
            numbers = (_octal(mode), _octal(uid), _octal(gid), _octal(size), _octal(mtime),
                       _octal(chksum), _octal(major), _octal(minor))
        except ValueError:
            return super().frombuf(buf, encoding, errors)
        if numbers[5] != sum(buf) - sum(buf[148:156]) + 8 * 32:  # the field counted as spaces
            return super().frombuf(buf, encoding, errors)
        info = cls()
        (info.mode, info.uid, info.gid, info.size, info.mtime, info.chksum,
         info.devmajor, info.devminor) = numbers
        info.type = kind
        info.name = name.partition(b"\0")[0].decode(encoding, errors)
        info.linkname = linkname.partition(b"\0")[0].decode(encoding, errors)
        info.uname = uname.partition(b"\0")[0].decode(encoding, errors)
        info.gname = gname.partition(b"\0")[0].decode(encoding, errors)
        head = prefix.partition(b"\0")[0].decode(encoding, errors)
        if kind == tarfile.AREGTYPE and info.name.endswith("/"):
            info.type = tarfile.DIRTYPE  # a V7 folder
        if info.isdir():
            info.name = info.name.rstrip("/")
        if head and info.type not in tarfile.GNU_TYPES:
            info.name = f"{head}/{info.name}"  # a ustar long name
        return info


def _octal(field: bytes) -> int:
    """A header number as tarfile reads it: octal digits up to the first NUL."""
    return int(field.partition(b"\0")[0] or b"0", 8)


class _TarSource(ArchiveSource):
    def __init__(self, path: Path, tf: tarfile.TarFile, raw: io.BufferedReader,
                 stream: io.BufferedIOBase) -> None:
        super().__init__(path)
        self.tf = tf
        self.raw = raw  # the archive file, compressed or not
        self.stream = stream  # the tar stream, decompressed

    def members(self) -> Iterator[Member]:
        while True:
            try:
                info = self.tf.next()
            except READ_ERRORS as exc:
                raise self.corrupt(exc) from exc
            if info is None:
                return
            yield _tar_member(info)

    def chunks(self, member: Member) -> Iterator[bytes | memoryview]:
        info: tarfile.TarInfo = member.handle
        if info.sparse is not None:  # holes to fill: tarfile's reader knows where
            return self._sparse_chunks(info)
        self.stream.seek(info.offset_data)
        if info.size <= _CHUNK:  # most members: one read, padding included
            return iter((self._read(info, info.size, -info.size % _BLOCK),))
        return self._large_chunks(info)

    def _read(self, info: tarfile.TarInfo, size: int, padding: int) -> bytes | memoryview:
        """``size`` bytes of data, reading on over ``padding`` to the next header."""
        data = self.stream.read(size + padding)
        if len(data) != size + padding:
            raise tarfile.ReadError(f"unexpected end of data in {info.name}")
        return memoryview(data)[:size] if padding else data

    def _large_chunks(self, info: tarfile.TarInfo) -> Iterator[bytes | memoryview]:
        left = info.size
        while left > _CHUNK:
            yield self._read(info, _CHUNK, 0)
            left -= _CHUNK
        yield self._read(info, left, -info.size % _BLOCK)

    def _sparse_chunks(self, info: tarfile.TarInfo) -> Iterator[bytes]:
        reader = self.tf.extractfile(info)
        assert reader is not None  # a regular member
        while chunk := reader.read(_CHUNK):
            yield chunk

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
    if info.isreg():
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
    return Member(info.name, "special", 0, mode, reason=reason, handle=info)


def _decompressed(raw: io.BufferedReader, kind: str) -> io.BufferedIOBase:
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
        raw = opened.enter_context(open(path, "rb"))
        source: ArchiveSource
        try:
            if kind == "zip":
                source = _ZipSource(path, opened.enter_context(zipfile.ZipFile(raw)))
            else:
                stream = opened.enter_context(_decompressed(raw, kind))
                tf = opened.enter_context(
                    tarfile.open(fileobj=stream, mode="r:", tarinfo=_TarHeader))
                source = _TarSource(path, tf, raw, stream)
        except READ_ERRORS as exc:
            raise ValueError(f"{path}: not a readable {kind} archive ({one_line(exc)})") from exc
        yield source
