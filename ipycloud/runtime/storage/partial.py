"""The part file of an unfinished download, and the proof that it may be resumed.

``<name>.part`` holds the bytes fetched so far; ``<name>.part.meta`` (JSON) records the URL
and the validators of the response those bytes came from: a strong ETag, and Last-Modified
when it is a strong validator (RFC 9110 8.8.2.2: at least a second before the response's
Date). A resumed request sends one of them as ``If-Range``, so a server whose file changed
answers with the whole new file instead of a range of it.

Both files live in the download folder and are never written, read or truncated through a
link: a part that is not a plain regular file of its own (a symlink, a FIFO, a device, a
hard link to another file) is removed, the name only, and the download starts over. A
folder of that name is not ours to remove: it stops the download.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from email.message import Message
from pathlib import Path
from typing import BinaryIO

from ipycloud.runtime.untrusted import is_count, load_json

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a planted FIFO must not wait for a peer
_MAX_META = 16 * 1024


class PartInTheWay(Exception):
    """A folder holds the part's name; the message is one line."""


@dataclass(frozen=True)
class Validators:
    """What identifies the version of a file a response carried."""

    url: str
    etag: str | None = None  # strong ETags only
    last_modified: str | None = None  # only when it is a strong validator
    size: int | None = None

    @classmethod
    def of(cls, url: str, headers: Message, size: int | None) -> Validators:
        """The validators a response's headers hold (weak ones left out)."""
        etag = headers.get("ETag")
        modified = headers.get("Last-Modified")
        return cls(url, etag if etag and not etag.startswith("W/") else None,
                   modified if modified and _strong_date(modified, headers.get("Date")) else None,
                   size)

    @property
    def if_range(self) -> str | None:
        """The value to send as If-Range: the ETag, else the date; None when neither."""
        return self.etag or self.last_modified

    def contradicted_by(self, other: Validators) -> bool:
        """Whether a response's validators show another version than ours."""
        pairs = ((self.etag, other.etag), (self.last_modified, other.last_modified),
                 (self.size, other.size))
        return any(mine is not None and theirs is not None and mine != theirs
                   for mine, theirs in pairs)


def _strong_date(modified: str, date: str | None) -> bool:
    """Whether Last-Modified is at least one second before the response's Date."""
    try:
        then = email.utils.parsedate_to_datetime(modified)
        now = email.utils.parsedate_to_datetime(date) if date else None
    except (TypeError, ValueError):
        return False
    return now is not None and (now - then).total_seconds() >= 1


class PartFile:
    """``<name>.part`` and its ``.meta`` in ``folder``."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = folder / f"{name}.part"
        self.meta = folder / f"{name}.part.meta"

    def size(self) -> int:
        """Bytes in the part; 0 when there is none or it was not ours (then removed)."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return 0
        if _own_file(info):
            return info.st_size
        self._unlink_name(self.path)
        return 0

    def validators(self) -> Validators | None:
        """What the meta file recorded, or None when it is missing, foreign or unreadable."""
        try:
            fd = os.open(self.meta, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:  # a symlink (ELOOP) or worse: not ours
            self._unlink_name(self.meta)
            return None
        with os.fdopen(fd, "rb") as fh:
            if not _own_file(os.fstat(fd)):
                self._unlink_name(self.meta)
                return None
            text = fh.read(_MAX_META + 1)
        return parse_validators(text) if len(text) <= _MAX_META else None

    @contextlib.contextmanager
    def appending(self) -> Iterator[BinaryIO]:
        """The part opened to add bytes at its end; never through a link."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _NONBLOCK)
        with os.fdopen(fd, "ab") as fh:
            if not _own_file(os.fstat(fd)):
                raise FileExistsError(f"{self.path} changed under the download")
            yield fh

    @contextlib.contextmanager
    def fresh(self, validators: Validators) -> Iterator[BinaryIO]:
        """An empty part, with ``validators`` recorded beside it first."""
        self.remove()
        self._create(self.meta, json.dumps(asdict(validators)).encode())
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            yield fh

    def publish(self, final: Path) -> None:
        """Rename the part to ``final`` (replacing a file or link there, never following)."""
        os.replace(self.path, final)
        self.meta.unlink(missing_ok=True)

    def remove(self) -> None:
        """Remove the part and its meta (names only; a folder in the way stops us)."""
        self._unlink_name(self.path)
        self._unlink_name(self.meta)

    @staticmethod
    def _unlink_name(path: Path) -> None:
        """Unlink ``path`` (the name, not what a link points to); a folder stops us."""
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:  # EISDIR on Linux, EPERM elsewhere
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise
            raise PartInTheWay(f"{path} is a folder, not a partial download: move it away "
                               "or pass filename=") from None

    @staticmethod
    def _create(path: Path, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)


def parse_validators(data: bytes) -> Validators | None:
    """The validators a meta file holding ``data`` records; None where it holds none."""
    try:
        found = Validators(**load_json(data))
    except (ValueError, TypeError):
        return None
    return found if _sound(found) else None


def _sound(validators: Validators) -> bool:
    """Whether recorded validators have the types a request can send: the URL and the
    header values text without control characters (no header of a request can be
    forged), the size a count."""
    texts = (validators.url, validators.etag, validators.last_modified)
    return (isinstance(validators.url, str)
            and all(text is None or (isinstance(text, str) and text.isprintable())
                    for text in texts)
            and (validators.size is None or is_count(validators.size)))


def _own_file(info: os.stat_result) -> bool:
    """A regular file with no other name: writing it changes nothing elsewhere."""
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1
