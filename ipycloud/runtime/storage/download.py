"""Verified, resumable HTTP(S) download into a folder, with an atomic final rename.

The bytes land in ``<name>.part`` next to the final file; an interrupted download leaves
that part behind and the next call resumes it with a ``Range`` request, but only when the
result cannot splice two versions of the file: the server proves it still has the same one
(``If-Range`` with the strong ETag or Last-Modified recorded beside the part; a 200 answer
starts over) or a checksum will verify the whole file (a resumed file that fails it is
fetched once more from the start). Otherwise the download starts over. Nothing is written
through a link (see ``partial``). Only a part that passed the size and checksum checks is
fsynced and renamed to its final name.
"""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ipycloud.runtime.durable import fsync_folder, refuse_a_file
from ipycloud.runtime.messages import scrub
from ipycloud.runtime.storage.errors import StorageError
from ipycloud.runtime.storage.partial import PartFile, PartInTheWay, Validators
from ipycloud.runtime.storage.verify import Expect, check_name, name_or_none
from ipycloud.runtime.units import counted

CHUNK = 1 << 16
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class DownloadResult:
    """What ``download`` produced: the final file, its size and sha256.

    ``resumed_from`` is the byte offset the final, successful request started at (0 for a
    full transfer); ``skipped`` is True when a valid file was already there.
    """

    path: Path
    size: int
    sha256: str
    resumed_from: int
    skipped: bool


class DownloadError(StorageError):
    """A download that could not complete or verify; the message is one line."""


class _Transient(Exception):
    """A failure worth retrying (dropped connection, timeout, 5xx)."""


class _ResumeFailedCheck(Exception):
    """A resumed file failed its checksum: its parts may come from two versions."""


@dataclass(frozen=True)
class _Url:
    """A validated URL: what to request, what may be shown, and the credentials it held."""

    request: str
    shown: str
    name: str | None
    auth: str | None
    secrets: tuple[str, ...]


def _write_chunk(fh: BinaryIO, data: bytes) -> None:
    """Append one chunk to the part file (a seam for tests)."""
    fh.write(data)


def _parse_url(url: str) -> _Url:
    """Validate an http(s) URL and split out its credentials; ValueError when malformed."""
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 for c in url):
        raise ValueError("malformed URL: it must be a string without spaces or control chars")
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ValueError(f"malformed URL: {str(exc).splitlines()[0]}") from None
    if parts.scheme.lower() not in {"http", "https"} or not host:
        raise ValueError("malformed URL: need http:// or https:// and a host")
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port is not None else ""
    path = parts.path or "/"
    shown = urllib.parse.urlunsplit((parts.scheme.lower(), netloc, path, "", ""))
    request = urllib.parse.urlunsplit((parts.scheme.lower(), netloc, path, parts.query, ""))
    return _Url(request, shown, _url_name(path), _basic_auth(parts), _secrets(parts))


def _url_name(path: str) -> str | None:
    """The URL path's last part, percent-decoded, when it is a safe file name."""
    return name_or_none(urllib.parse.unquote(PurePosixPath(path).name))


def _basic_auth(parts: urllib.parse.SplitResult) -> str | None:
    """A Basic Authorization value for ``user:password@`` in the URL, or None."""
    if parts.username is None:
        return None
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def _secrets(parts: urllib.parse.SplitResult) -> tuple[str, ...]:
    """Strings that must never appear in a message: userinfo and query."""
    found = [parts.username, parts.password, parts.query, parts.fragment]
    return tuple(s for s in found if s)


def _existing(path: Path, expect: Expect) -> DownloadResult | None:
    """A skipped result when ``path`` already holds the expected file, else None."""
    if not expect.anything or not path.is_file():
        return None
    size = path.stat().st_size
    if expect.size is not None and size != expect.size:
        return None
    digests = expect.digests_of(path)
    if expect.mismatch(digests) is not None:
        return None
    return DownloadResult(path, size, digests["sha256"], 0, True)


def _int_or_none(value: str | None) -> int | None:
    """An integer header value, or None when missing or not a number."""
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(start, total) from ``bytes a-b/total`` or ``bytes */total``; None where unknown."""
    if not value or not value.strip().lower().startswith("bytes"):
        return None, None
    spec, _, total = value.strip()[5:].strip().partition("/")
    start = _int_or_none(spec.split("-")[0]) if spec != "*" else None
    return start, _int_or_none(total)


class _Job:
    """One download: the retry loop, the transfer and the final verification."""

    def __init__(self, url: _Url, folder: Path, name: str | None, expect: Expect, *,
                 progress: bool, retries: int, timeout: float,
                 headers: Mapping[str, str] | None) -> None:
        self.url, self.folder, self.name, self.expect = url, folder, name, expect
        self.progress, self.retries, self.timeout = progress, max(0, retries), timeout
        self.headers: dict[str, str] = dict(headers or {})
        self.total: int | None = None  # what the server said, once it answered
        self.may_resume = True  # False once a resumed file failed its checksum

    # -- paths and messages -------------------------------------------------------------
    @property
    def part(self) -> PartFile:
        """The temporary file the bytes go to (the name is known once this is used)."""
        return PartFile(self.folder, str(self.name))

    def part_size(self, name: str | None = None) -> int:
        """Bytes already in the part file of ``name`` (default: ours); 0 when none."""
        name = name or self.name
        return PartFile(self.folder, name).size() if name is not None else 0

    @property
    def expected_size(self) -> int | None:
        """The file's size: as the caller gave it, else as the server said, else None."""
        return self.expect.size if self.expect.size is not None else self.total

    @property
    def checksummed(self) -> bool:
        """Whether a checksum will verify the whole file, whatever its parts' origin."""
        return self.expect.sha256 is not None or self.expect.md5 is not None

    def fail(self, text: str) -> DownloadError:
        """A one-line DownloadError naming the (credential-free) URL."""
        return DownloadError(scrub(f"{self.url.shown}: {text}", self.url.secrets))

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> DownloadResult:
        """Transfer, verify and rename; a resumed file failing its checksum is fetched
        once more from the start."""
        try:
            while True:
                start = self.transfer()
                try:
                    return self.finish(start)
                except _ResumeFailedCheck:
                    self.may_resume = False
        except PartInTheWay as exc:
            raise self.fail(str(exc)) from None

    def transfer(self) -> int:
        """Attempt, retrying with resume on transient failures; the last start offset."""
        failures = 0
        while True:
            try:
                return self.attempt()
            except _Transient as exc:
                failures += 1
                if failures > self.retries:
                    raise self.gave_up(str(exc), failures) from None
                time.sleep(0.2 * failures)

    def gave_up(self, reason: str, attempts: int) -> DownloadError:
        """The error after the last retry, saying what was fetched and how to resume."""
        have = self.part_size()
        total = self.expected_size
        of = f" of {total}" if total is not None else ""
        if not have:
            hint = "rerun to try again"
        elif self.resume_point(self.name)[0]:
            hint = "rerun to resume from the .part file"
        else:
            hint = ("the server gives no ETag or Last-Modified to resume by: give the "
                    "file's SHA-256 to resume, or rerun to start over")
        return self.fail(f"failed after {counted(attempts, 'attempt')} ({reason}); "
                         f"fetched {have}{of} bytes; {hint}")

    def resume_point(self, name: str | None) -> tuple[int, Validators | None]:
        """Where the part of ``name`` may resume, and what the server must confirm.

        A part is resumed when the server can prove it still has the same file (a strong
        validator recorded beside the part, sent as If-Range) or when a checksum will check
        the whole file; otherwise the download starts over.
        """
        if name is None or not self.may_resume:
            return 0, None
        part = PartFile(self.folder, name)
        have = part.size()
        if not have:
            return 0, None
        proof = part.validators()
        if proof is not None and proof.url != self.url.shown:
            proof = None
        if (proof is not None and proof.if_range is not None) or self.checksummed:
            return have, proof
        return 0, None

    def attempt(self) -> int:
        """One request; returns the offset it started at once the part is complete."""
        guess = self.name or self.url.name
        offset, proof = self.resume_point(guess)
        try:
            resp = self.open(offset, proof)
        except urllib.error.HTTPError as exc:
            exc.close()
            self.name = self.name or (guess if exc.code == 416 else None)
            return self.on_http_error(exc, offset, proof)
        with resp:
            if self.name is None:
                self.name = self.name_from(resp)
                if self.name != guess and (offset or self.part_size()):
                    resp.close()
                    return self.attempt()
            offset = self.accept(resp, offset, proof)
            self.check_space(offset)
            self.stream(resp, offset)
        return offset

    def open(self, offset: int, proof: Validators | None) -> http.client.HTTPResponse:
        """Send the GET (with ``Range`` and ``If-Range`` when resuming); transport errors
        are transient."""
        req = urllib.request.Request(self.url.request, headers=self.headers)
        if self.url.auth and "authorization" not in {k.lower() for k in self.headers}:
            req.add_unredirected_header("Authorization", self.url.auth)
        if offset > 0:
            req.add_header("Range", f"bytes={offset}-")
            if proof is not None and proof.if_range is not None:
                req.add_header("If-Range", proof.if_range)
        try:
            resp: http.client.HTTPResponse = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise _Transient(f"cannot connect: {reason}") from None
        return resp

    def on_http_error(self, exc: urllib.error.HTTPError, offset: int,
                      proof: Validators | None) -> int:
        """416 on a complete part means done; 5xx is transient; anything else fails."""
        status = f"HTTP {exc.code} {exc.reason}"
        if exc.code == 416 and offset > 0:
            total = _content_range(exc.headers.get("Content-Range"))[1]
            changed = proof is not None and proof.contradicted_by(
                Validators(self.url.shown, size=total))
            if offset in {total, self.expect.size} and not changed:
                self.total = total
                return offset
            self.part.remove()
            raise _Transient(f"{status}; starting over")
        if exc.code in _TRANSIENT_STATUS:
            raise _Transient(status)
        raise self.fail(status)

    def name_from(self, resp: http.client.HTTPResponse) -> str:
        """The file name from Content-Disposition, else the (final) URL's last part."""
        suggested = resp.headers.get_filename()
        if suggested is not None:
            if name_or_none(suggested) is None:
                raise self.fail(f"server suggested an unsafe file name {suggested!r}")
            return suggested
        name = _url_name(urllib.parse.urlsplit(resp.geturl()).path) or self.url.name
        if name is None:
            raise self.fail("cannot tell the file name; pass filename=")
        return name

    def accept(self, resp: http.client.HTTPResponse, offset: int,
               proof: Validators | None) -> int:
        """Check the status against the request; return the offset the body starts at.

        A 206 whose validators show another version than the part's (a server that
        ignored If-Range) removes the part: the retry starts over.
        """
        if resp.status == 206:
            start, self.total = _content_range(resp.headers.get("Content-Range"))
            if start != offset:
                self.part.remove()
                raise _Transient(f"server sent range from {start}, asked {offset}")
            if proof is not None and proof.contradicted_by(self.validators_of(resp)):
                self.part.remove()
                raise _Transient("the file changed on the server; starting over")
            return offset
        if resp.status == 200:
            self.total = _int_or_none(resp.headers.get("Content-Length"))
            return 0
        raise self.fail(f"unexpected HTTP {resp.status} {resp.reason}")

    def validators_of(self, resp: http.client.HTTPResponse) -> Validators:
        """What identifies the version of the file this response carries."""
        return Validators.of(self.url.shown, resp.headers, self.total)

    def check_space(self, offset: int) -> None:
        """Refuse before writing when the folder cannot hold the rest of the file."""
        total = self.expected_size
        if total is None:
            return
        free = shutil.disk_usage(self.folder).free
        if free < total - offset:
            raise self.fail(f"not enough free space in {self.folder}: "
                            f"need {total - offset} bytes, {free} free")

    def stream(self, resp: http.client.HTTPResponse, offset: int) -> None:
        """Copy the body into the part file (a fresh one from offset 0); a short body is a
        transient failure."""
        from tqdm.auto import tqdm

        length = _int_or_none(resp.headers.get("Content-Length"))
        got = 0
        target = self.part.appending() if offset else self.part.fresh(self.validators_of(resp))
        with target as fh, tqdm(
            total=self.expected_size, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
            desc=self.name, disable=not self.progress, leave=False,
        ) as bar:
            while chunk := self.read(resp, offset + got):
                _write_chunk(fh, chunk)
                got += len(chunk)
                bar.update(len(chunk))
            fh.flush()
            os.fsync(fh.fileno())
        if length is not None and got < length:
            raise _Transient(f"connection closed at byte {offset + got}")

    def read(self, resp: http.client.HTTPResponse, at: int) -> bytes:
        """One chunk of the body; network errors are transient."""
        try:
            return resp.read(CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            raise _Transient(f"connection lost at byte {at}: {type(exc).__name__}") from None

    def finish(self, start: int) -> DownloadResult:
        """Verify size and checksums, then rename the part to its final name atomically."""
        part = self.part
        size = part.size()
        want = self.expected_size
        if want is not None and size != want:
            part.remove()
            raise self.fail(f"size mismatch for {self.name}: expected {want}, got {size}")
        digests = self.expect.digests_of(part.path)
        problem = self.expect.mismatch(digests)
        if problem is not None:
            part.remove()
            if start:
                raise _ResumeFailedCheck
            raise self.fail(f"checksum mismatch for {self.name}: {problem}")
        final = self.folder / str(self.name)
        part.publish(final)
        fsync_folder(self.folder)
        return DownloadResult(final, size, digests["sha256"], start, False)


def download(
    url: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    filename: str | None = None,
    sha256: str | None = None,
    md5: str | None = None,
    size: int | None = None,
    progress: bool = True,
    retries: int = 3,
    timeout: float = 60.0,
    headers: Mapping[str, str] | None = None,
) -> DownloadResult:
    """Download ``url`` into the folder ``dest`` (default: the current folder), verified.

    The name is ``filename``, else the server's Content-Disposition, else the URL path's
    last part. Bytes go to ``<name>.part`` and resume from it; ``size``/``sha256``/``md5``
    are checked before the atomic rename. A file already present that matches the given
    checksums (or, with none given, ``size``) is returned with ``skipped=True`` and no
    request; that check uses ``filename`` or the URL's last part.
    Raises ValueError for a malformed URL or unsafe name, DownloadError otherwise.
    """
    parsed = _parse_url(url)
    if filename is not None:
        check_name(filename)
    expect = Expect.given(sha256, md5, size)
    folder = Path(dest) if dest is not None else Path.cwd()
    refuse_a_file(folder)
    folder.mkdir(parents=True, exist_ok=True)
    guess = filename or parsed.name
    if guess is not None and (done := _existing(folder / guess, expect)) is not None:
        return done
    return _Job(parsed, folder, filename, expect, progress=progress, retries=retries,
                timeout=timeout, headers=headers).run()
