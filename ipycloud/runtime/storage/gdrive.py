"""Google Drive downloads (a file or a folder, by ID or share link), verified and atomic.

gdown does the talking to Drive (the ``uc?id=`` link, the virus-scan confirmation form,
the folder listing). It writes into a staging folder beside the destination,
``<dest>/.ipycloud-gdrive/<ID>/``, with ``resume=True``, so an interrupted file is
picked up from its ``.part`` by the next call. Only a complete, verified file (or a
complete folder) is fsynced and renamed to its final name; a small marker
``.ipycloud-gdrive/<ID>.json`` records what was published, so a second call is answered
without a request.
"""

from __future__ import annotations

import abc
import json
import os
import re
import shutil
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ipycloud.runtime._optional import require
from ipycloud.runtime.durable import (
    folder_lock,
    fsync_file,
    fsync_folder,
    fsync_tree,
    refuse_a_file,
    replace_folder,
    write_bytes_atomically,
)
from ipycloud.runtime.messages import errno_reason, one_line, worded
from ipycloud.runtime.storage.errors import StorageError
from ipycloud.runtime.storage.mount import data_folder
from ipycloud.runtime.storage.verify import Expect, check_name, hash_file
from ipycloud.runtime.units import counted
from ipycloud.runtime.untrusted import load_json, read_small

STAGING = ".ipycloud-gdrive"
TIMEOUT_S = 60.0
MARKER_BYTES = 64 << 10  # a marker holds a name, a size and a digest
_HOSTS = frozenset({"drive.google.com", "docs.google.com", "drive.usercontent.google.com"})
_ID = re.compile(r"[A-Za-z0-9_-]{25,128}")
_FILE_PATH = re.compile(r"/file(?:/u/\d+)?/d/([^/]+)(?:/(?:view|edit|preview))?/?")
_FOLDER_PATH = re.compile(r"/drive(?:/u/\d+)?(?:/mobile)?/folders/([^/]+)/?")
_QUERY_PATHS = {"/uc": "file", "/open": "file", "/download": "file",
                "/embeddedfolderview": "folder", "/folderview": "folder"}
_SHARE_HINT = "share it as 'Anyone with the link' (Share > General access)"


class GdriveError(StorageError):
    """A Google Drive download that failed; the message is one line and says what to do."""


@dataclass(frozen=True)
class GdriveResult:
    """What ``gdrive_download`` produced: the final file or folder and what it holds.

    ``files`` counts the files (1 for a file), ``size`` is their total in bytes;
    ``sha256`` is set for a file only; ``skipped`` is True when it was already there.
    """

    path: Path
    kind: str  # "file" or "folder"
    id: str
    files: int
    size: int
    sha256: str | None
    skipped: bool

    def summary(self) -> str:
        """One line: what happened, where, how much."""
        from ipycloud.runtime.units import format_bytes

        state = "already present" if self.skipped else "downloaded"
        details = [format_bytes(self.size)]
        if self.kind == "folder":
            details.insert(0, f"{self.files} file{'s' if self.files != 1 else ''}")
        if self.sha256 is not None:
            details.append(f"sha256 {self.sha256[:12]}")
        return f"Drive {self.kind} {self.id} {state}: {self.path} ({', '.join(details)})"

    def __str__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())


# -- parsing IDs and links ----------------------------------------------------------------
def _shown(text: str) -> str:
    """``text`` quoted and cut short, for a message."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _check_id(value: str, source: str) -> str:
    """``value`` when it looks like a Drive ID; ValueError naming ``source`` otherwise."""
    if not _ID.fullmatch(value):
        where = f" in {_shown(source)}" if source != value else ""
        raise ValueError(f"invalid Google Drive ID {_shown(value)}{where}: "
                         "expected 25 or more letters, digits, '-' or '_'")
    return value


def _id_in_link(parts: urllib.parse.SplitResult, source: str) -> tuple[str, str]:
    """(kind, raw ID) from the path or the ``id=`` query of a Drive link."""
    path = re.sub(r"^/u/\d+(?=/)", "", parts.path)
    for kind, pattern in (("file", _FILE_PATH), ("folder", _FOLDER_PATH)):
        if match := pattern.fullmatch(path):
            return kind, match.group(1)
    query_kind = _QUERY_PATHS.get(path.rstrip("/"))
    ids = urllib.parse.parse_qs(parts.query).get("id", [])
    if query_kind is None or len(ids) != 1:
        raise ValueError(f"no Google Drive file or folder ID in {_shown(source)}: use a "
                         "share link (.../file/d/ID/..., .../folders/ID) or a bare ID")
    return query_kind, ids[0]


def drive_id(id_or_link: str) -> tuple[str, str]:
    """("file" or "folder", ID) of a bare Drive ID or a share link; ValueError when malformed.

    A bare ID is taken as a file; pass a folder link to download a folder.
    """
    text = id_or_link.strip() if isinstance(id_or_link, str) else ""
    if not text:
        raise ValueError("empty Google Drive ID or link")
    if "/" not in text and ":" not in text and "?" not in text:
        return "file", _check_id(text, text)
    link = text if "://" in text else f"https://{text}"
    try:
        parts = urllib.parse.urlsplit(link)
        host = (parts.hostname or "").lower()
    except ValueError:
        raise ValueError(f"malformed Google Drive link {_shown(text)}") from None
    if parts.scheme.lower() not in {"http", "https"} or host not in _HOSTS:
        raise ValueError(f"not a Google Drive link: {_shown(text)} (expected an https "
                         "link on drive.google.com or docs.google.com)")
    kind, raw = _id_in_link(parts, text)
    return kind, _check_id(raw, text)


# -- turning gdown's failures into one actionable line ------------------------------------
def _chain(error: BaseException) -> list[BaseException]:
    """The error and its causes and contexts, outermost first."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _http_status(error: BaseException) -> int | None:
    """The status of the last HTTP response gdown held when it failed, if any.

    gdown's messages do not carry it, so the failing frames are read (by type, not by
    variable name); None when none holds a response.
    """
    import requests

    status = None
    for link in _chain(error):
        tb = link.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                if isinstance(value, requests.Response):
                    status = value.status_code
            tb = tb.tb_next
    return status


def _network_reason(text: str) -> str:
    """The innermost reason of a requests/urllib3 connection error, e.g. 'Connection refused'."""
    found = errno_reason(text)
    return found[1] if found else text[:120]


def _failure(error: Exception, kind: str, drive: str) -> GdriveError:
    """A one-line GdriveError for what gdown raised while fetching ``kind`` ``drive``."""
    import requests

    what = f"Drive {kind} {drive}"
    text = one_line(error)
    status = _http_status(error)
    if "too many users" in text.lower() or "quota exceeded" in text.lower():
        return GdriveError(f"{what}: download quota exceeded (too many users fetched it "
                           "recently): try again in up to 24 h, or copy it to your own Drive "
                           "and share the copy")
    if status == 404 or "status code 404" in text:
        return GdriveError(f"{what} not found (HTTP 404): check the ID or link")
    if isinstance(error, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return GdriveError(f"cannot reach Google Drive to fetch {kind} {drive} "
                           f"({_network_reason(text)}): check the network (and HTTPS_PROXY, "
                           "if set), then rerun")
    if "Cannot retrieve the public link" in text or status in {401, 403} or (
            "Failed to retrieve folder contents" in text):
        return GdriveError(f"cannot access {what}: it is not public; {_SHARE_HINT}")
    if text.startswith("Failed to download the following files"):
        count = str(error).count("\n- ")
        return GdriveError(f"{what}: {counted(count, 'file')} failed to download; rerun to "
                           "resume "
                           f"(if it keeps failing, {_SHARE_HINT} or try later)")
    if "incomplete" in text:
        return GdriveError(f"{what}: the download stopped early ({text.split('.')[0]}); "
                           "rerun to resume from the .part file")
    return GdriveError(f"{what}: {text}")


# -- small file-system helpers ------------------------------------------------------------
def _destination(dest: str | os.PathLike[str] | None) -> Path:
    """``dest``, else the mounted project's data folder, else ./data; NotADirectoryError
    where a file stands in its way."""
    folder = Path(dest).expanduser() if dest is not None else data_folder()
    refuse_a_file(folder)
    return folder


def _read_marker(path: Path) -> dict[str, Any]:
    """The marker's record, or {} when missing or unreadable (not a regular file, too
    large, not JSON)."""
    try:
        record = load_json(read_small(path, MARKER_BYTES))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_marker(path: Path, **record: Any) -> None:
    """Record durably what was published."""
    write_bytes_atomically(path, json.dumps(record, sort_keys=True).encode("utf-8"))


# -- the two kinds of job -----------------------------------------------------------------
@dataclass
class _Job(abc.ABC):
    """What both jobs share: where things go and how gdown is called."""

    folder: Path
    drive: str
    filename: str | None
    force: bool
    progress: bool
    retries: int

    @property
    def staging(self) -> Path:
        return self.folder / STAGING / self.drive

    @property
    def marker(self) -> Path:
        return self.folder / STAGING / f"{self.drive}.json"

    def gdown_options(self) -> dict[str, Any]:
        """Keyword arguments for gdown: quiet unless progress, resumable, no cookie file."""
        return {"quiet": not self.progress, "use_cookies": False, "resume": True,
                "retries": self.retries, "timeout": TIMEOUT_S}

    def gdown(self) -> ModuleType:
        return require("gdown", "drive")

    def run(self) -> GdriveResult:
        """The result already there, else a fresh download published into place."""
        if not self.force and (done := self.existing()) is not None:
            return done
        if self.force:
            shutil.rmtree(self.staging, ignore_errors=True)
        return self.publish(self.fetch())

    @abc.abstractmethod
    def existing(self) -> GdriveResult | None:
        """A skipped result when the download is already in place, else None."""

    @abc.abstractmethod
    def fetch(self) -> Path:
        """Let gdown download into staging; returns what it made."""

    @abc.abstractmethod
    def publish(self, staged: Path) -> GdriveResult:
        """Verify what was staged and move it into place."""


@dataclass
class _FileJob(_Job):
    """One file: skip, fetch into staging, verify, rename into place."""

    expect: Expect

    def existing(self) -> GdriveResult | None:
        """A skipped result when the file is already there and valid, else None."""
        record = _read_marker(self.marker)
        name = self.filename or (record.get("name") if record.get("kind") == "file" else None)
        path = self.folder / name if isinstance(name, str) else None
        if path is None or not path.is_file():
            return None
        size = path.stat().st_size
        if self.expect.anything:
            digests = self.expect.digests_of(path)
            if self.expect.mismatch(digests) is not None:
                return None
            return GdriveResult(path, "file", self.drive, 1, size, digests["sha256"], True)
        if record.get("name") == name and record.get("size") not in (None, size):
            return None  # changed since it was downloaded
        sha = record.get("sha256") if record.get("name") == name else None
        sha = sha or hash_file(path, md5=False)["sha256"]
        return GdriveResult(path, "file", self.drive, 1, size, sha, True)

    def fetch(self) -> Path:
        """Let gdown download into the staging folder; returns the staged file."""
        gdown = self.gdown()
        self.staging.mkdir(parents=True, exist_ok=True)
        try:
            out = gdown.download(id=self.drive, output=f"{self.staging}{os.sep}",
                                 **self.gdown_options())
        except Exception as error:
            raise _failure(error, "file", self.drive) from error
        return Path(out)

    def publish(self, staged: Path) -> GdriveResult:
        """Verify the staged file, then fsync and rename it to its final name."""
        name = self.filename or staged.name
        if name == STAGING:
            name = f"_{name}"
        digests = self.expect.digests_of(staged)
        problem = self.expect.mismatch(digests)
        if problem is not None:
            staged.unlink(missing_ok=True)
            raise GdriveError(f"checksum mismatch for {name} from Drive file {self.drive}: "
                              f"{problem}; the download was deleted, nothing was written")
        fsync_file(staged)
        final = self.folder / name
        os.replace(staged, final)
        fsync_folder(self.folder)
        size = final.stat().st_size
        _write_marker(self.marker, kind="file", name=name, size=size, sha256=digests["sha256"])
        shutil.rmtree(self.staging, ignore_errors=True)
        return GdriveResult(final, "file", self.drive, 1, size, digests["sha256"], False)


@dataclass
class _FolderJob(_Job):
    """One folder: skip by marker, fetch into staging, rename the whole folder into place."""

    @property
    def staging(self) -> Path:
        return self.folder / STAGING / f"{self.drive}.folder"

    def existing(self) -> GdriveResult | None:
        """A skipped result when the marker shows this folder was published, else None."""
        record = _read_marker(self.marker)
        name = record.get("name")
        if record.get("kind") != "folder" or not isinstance(name, str):
            return None
        if self.filename not in (None, name) or not (self.folder / name).is_dir():
            return None
        return GdriveResult(self.folder / name, "folder", self.drive,
                            int(record.get("files", 0)), int(record.get("size", 0)), None, True)

    def fetch(self) -> Path:
        """Let gdown download the folder into staging; returns the staged folder."""
        gdown = self.gdown()
        self.staging.mkdir(parents=True, exist_ok=True)
        try:
            paths = gdown.download_folder(id=self.drive, output=f"{self.staging}{os.sep}",
                                          **self.gdown_options())
        except Exception as error:
            raise _failure(error, "folder", self.drive) from error
        if not paths:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise GdriveError(f"Drive folder {self.drive} lists no files: if it is not "
                              f"empty, {_SHARE_HINT} (a private folder looks empty)")
        return self.staging / Path(paths[0]).relative_to(self.staging).parts[0]

    def publish(self, root: Path) -> GdriveResult:
        """Rename the complete staged folder into place (replacing the old one on force)."""
        name = self.filename or root.name
        final = self.folder / name
        if final.exists() and not self.force:
            raise worded(GdriveError, "{final} already exists and was not downloaded from "
                         "Drive folder {drive}: pass {force} to replace it", final=str(final),
                         drive=str(self.drive), force="force=True")
        listed = fsync_tree(root)
        files, size = len(listed), sum(size for _, size in listed)
        replace_folder(root, final)
        _write_marker(self.marker, kind="folder", name=name, files=files, size=size)
        shutil.rmtree(self.staging, ignore_errors=True)
        return GdriveResult(final, "folder", self.drive, files, size, None, False)


def gdrive_download(
    id_or_link: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    filename: str | None = None,
    sha256: str | None = None,
    md5: str | None = None,
    force: bool = False,
    progress: bool = True,
    retries: int = 3,
) -> GdriveResult:
    """Download a public Drive file or folder (ID or share link) into the folder ``dest``.

    ``dest`` defaults to ``<project>/data`` of the last ``mount()``, else ``./data``.
    ``filename`` renames the file (or folder). A file is verified against ``sha256`` /
    ``md5`` before it gets its final name; one already there (matching them, or with none
    given, just present) is returned with ``skipped=True`` and no request, as is a folder
    downloaded before; ``force`` downloads again. ``retries`` resumes a dropped transfer.
    Raises ValueError for a malformed ID, link or checksum, GdriveError when Drive fails.
    """
    kind, drive = drive_id(id_or_link)
    if filename is not None:
        check_name(filename)
    if retries < 0:
        raise ValueError("retries must be >= 0")
    expect = Expect.given(sha256, md5)
    if kind == "folder" and expect.anything:
        raise ValueError("sha256 and md5 check a file; this link is a Drive folder")
    folder = _destination(dest)
    (folder / STAGING).mkdir(parents=True, exist_ok=True)
    with folder_lock(folder / STAGING):  # one download at a time into this folder
        if kind == "folder":
            return _FolderJob(folder, drive, filename, force, progress, retries).run()
        return _FileJob(folder, drive, filename, force, progress, retries, expect).run()
