"""Reading a tar stream once, front to back, with tarfile's semantics at a fraction of its
cost per member.

Most archives are runs of plain members: one 512-byte ustar or GNU header each (a file, a
folder, a link, a device), then the data. Those are read here: the header decoded by
``TarHeader`` (the fields as tarfile decodes them, compared against it on damaged headers
in the tests), the data read straight from the stream. At the first block that is
anything else (a pax or GNU long-name record, an old-GNU sparse member, a bad checksum,
base-256 numbers, the end of the archive), tarfile takes over from that block to the end,
with the block given back to it: no stream ever seeks back, so a compressed archive is
decompressed once.
"""

from __future__ import annotations

import io
import struct
import tarfile
import zlib
from collections.abc import Iterator
from typing import BinaryIO

_BLOCK = tarfile.BLOCKSIZE
_CHUNK = 1 << 20
# Types whose header is the whole member: tarfile reads these without extra records.
_PLAIN_TYPES = frozenset((tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE,
                          tarfile.LNKTYPE, tarfile.SYMTYPE, tarfile.CHRTYPE,
                          tarfile.BLKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE))
_ENCODING, _ERRORS = tarfile.ENCODING, "surrogateescape"  # tarfile's defaults


class TarHeader(tarfile.TarInfo):
    """A TarInfo decoded from a plain header block in a third of tarfile's time.

    tarfile takes this class through its documented ``tarinfo`` argument. A block whose
    numbers are octal digits followed by nothing but NULs and spaces (as tar writes them),
    with a name, a checksum that unsigned arithmetic matches and no old-GNU sparse map, is
    decoded here, field by field as tarfile does; any other block (an end-of-archive block,
    base-256 numbers, a NUL amid a number, a bad or signed checksum, a sparse map) goes to
    tarfile's own decoding, which accepts or rejects it.
    """

    __slots__ = ()
    _LAYOUT = struct.Struct("100s8s8s8s12s12s8sc100s8x32s32s8s8s155s12x")

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> TarHeader:
        decoded = cls.decode(buf, encoding, errors)
        return decoded if decoded is not None else super().frombuf(buf, encoding, errors)

    @classmethod
    def plain(cls, buf: bytes) -> TarHeader | None:
        """The member a block describes on its own (see ``_PLAIN_TYPES``), else None."""
        if buf[156:157] not in _PLAIN_TYPES:
            return None
        return cls.decode(buf, _ENCODING, _ERRORS)

    @classmethod
    def decode(cls, buf: bytes | bytearray, encoding: str, errors: str) -> TarHeader | None:
        """The header in ``buf``, or None for a block out of the ordinary."""
        if len(buf) != _BLOCK or not buf[0] or buf[156:157] == tarfile.GNUTYPE_SPARSE:
            return None
        (name, mode, uid, gid, size, mtime, chksum, kind, linkname, uname, gname,
         major, minor, prefix) = cls._LAYOUT.unpack(buf)
        try:  # tarfile reads up to the first NUL: one left amid the digits makes int() fail
            numbers = (_octal(mode), _octal(uid), _octal(gid), _octal(size), _octal(mtime),
                       _octal(chksum), _octal(major), _octal(minor))
        except ValueError:
            return None
        if numbers[5] != _byte_sum(buf) - sum(chksum) + 8 * 32:  # the field counted as spaces
            return None
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
    """A header number: octal digits, then NULs and spaces."""
    return int(field.rstrip(b"\0 ") or b"0", 8)


_ODD = bytes(range(2)) * 128  # byte -> its lowest bit


def _byte_sum(block: bytes | bytearray) -> int:
    """``sum(block)`` for a header block, in half its time. Adler-32's low half is 1 + the
    sum modulo 65521; the sum of 512 bytes is below twice 65521, so it is one of two
    numbers, which differ in parity: the count of odd bytes tells which."""
    low = ((zlib.adler32(block) & 0xFFFF) - 1) % 65521
    return low if (low - block.translate(_ODD).count(1)) % 2 == 0 else low + 65521


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


class _Replay:
    """The tar stream from the block where plain reading stopped: that block, given back,
    then the rest. tarfile reads it from there, seeking forward only."""

    def __init__(self, stream: io.BufferedIOBase | BinaryIO, block: bytes, offset: int) -> None:
        self.stream = stream
        self.pending = block
        self.position = offset  # in the tar stream

    def read(self, size: int = -1) -> bytes:
        head = self.pending
        if 0 <= size <= len(head):
            data, self.pending = head[:size], head[size:]
        else:
            data = head + self.stream.read(size - len(head) if size >= 0 else -1)
            self.pending = b""
        self.position += len(data)
        return data

    def tell(self) -> int:
        return self.position

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET or position < self.position:
            raise io.UnsupportedOperation("the tar stream is read forward only")
        skip = position - self.position
        if skip > len(self.pending):
            self.stream.seek(skip - len(self.pending), io.SEEK_CUR)
        self.pending = self.pending[skip:]
        self.position = position
        return position

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


class TarStream:
    """The members of the tar ``stream`` (decompressed) and their bytes, in one pass."""

    def __init__(self, stream: io.BufferedIOBase | BinaryIO) -> None:
        self.stream: io.BufferedIOBase | BinaryIO | _Replay = stream
        self.position = 0  # where reading is, in the stream, while reading plain members
        self.tarfile: tarfile.TarFile | None = None  # reading, once it took over

    def __iter__(self) -> Iterator[tarfile.TarInfo]:
        """Every member in order: plain ones read here, the rest by tarfile. tarfile's
        errors (ReadError, OSError, EOFError...) pass through."""
        while self.tarfile is None:
            offset = self.position
            block = self.stream.read(_BLOCK)
            self.position += len(block)
            info = TarHeader.plain(block)
            if info is None:
                self._hand_over(block, offset)
                break
            info.offset, info.offset_data = offset, offset + _BLOCK
            end = info.offset_data + (_padded(info.size) if info.isreg() else 0)
            yield info
            if self.position != end:  # its data was not read: skip it
                self._skip_to(end)
        assert self.tarfile is not None
        yield from self.tarfile

    def _skip_to(self, end: int) -> None:
        """Go on to ``end``; as tarfile does, its last byte must be there."""
        self.stream.seek(end - self.position - 1, io.SEEK_CUR)
        if not self.stream.read(1):
            raise tarfile.ReadError("unexpected end of data")
        self.position = end

    def _hand_over(self, block: bytes, offset: int) -> None:
        assert not isinstance(self.stream, _Replay)  # handed over once
        self.stream = _Replay(self.stream, block, offset)
        # Reading from a file object of ours, it holds nothing that closing would release.
        self.tarfile = tarfile.TarFile(fileobj=self.stream, tarinfo=TarHeader)  # type: ignore[arg-type]

    def chunks(self, info: tarfile.TarInfo) -> Iterator[bytes | memoryview]:
        """The bytes of the regular member just yielded, in chunks of at most 1 MiB."""
        if self.tarfile is not None:
            if info.sparse is not None:  # holes to fill: tarfile's reader knows where
                return self._sparse_chunks(self.tarfile, info)
            self.stream.seek(info.offset_data)
        elif self.position != info.offset_data:
            raise ValueError(f"{info.name} is not the member just read")
        if info.size <= _CHUNK:  # most members: one read, padding included
            return iter((self._read(info, info.size, _padded(info.size) - info.size),))
        return self._large_chunks(info)

    def _read(self, info: tarfile.TarInfo, size: int, padding: int) -> bytes | memoryview:
        """``size`` bytes of data, reading on over ``padding`` to the next header (a cut
        there is found, as tarfile finds it, on the way to the next header)."""
        data = self.stream.read(size + padding)
        self.position += len(data)
        if len(data) < size:
            raise tarfile.ReadError(f"unexpected end of data in {info.name}")
        return memoryview(data)[:size] if len(data) > size else data

    def _large_chunks(self, info: tarfile.TarInfo) -> Iterator[bytes | memoryview]:
        left = info.size
        while left > _CHUNK:
            yield self._read(info, _CHUNK, 0)
            left -= _CHUNK
        yield self._read(info, left, _padded(info.size) - info.size)

    @staticmethod
    def _sparse_chunks(archive: tarfile.TarFile, info: tarfile.TarInfo) -> Iterator[bytes]:
        reader = archive.extractfile(info)
        assert reader is not None  # a regular member
        while chunk := reader.read(_CHUNK):
            yield chunk
