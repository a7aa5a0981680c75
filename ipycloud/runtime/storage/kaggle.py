"""Kaggle datasets and competition data into the project folder, through kagglehub.

kagglehub does the transfer into its own cache (``$KAGGLEHUB_CACHE``, default
``~/.cache/kagglehub``): it follows the API's redirect to the storage, checks the archive
against the ``x-goog-hash`` MD5, resumes a partial archive with a ``Range`` request when a
call is rerun, and extracts it. The extracted files are then moved out of the cache (copied
when kagglehub answered with a read-only mount, as in Kaggle notebooks) into a temporary
folder beside the destination, a manifest (``.ipycloud-kaggle.json``: handle, version,
files and sizes) is written and fsynced with them, and the folder is renamed into place.
The destination holds the whole download or nothing new; a later call finds the manifest
and returns at once, without a request, unless ``force=True``.

Credentials come from ``kaggle_credentials``; keys never appear in messages: they are
scrubbed from anything kagglehub or requests says.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipycloud.runtime._optional import require
from ipycloud.runtime.durable import (
    fsync_tree,
    remove_path,
    replace_folder,
    stale_temporary,
    temp_name_for,
    write_bytes_atomically,
)
from ipycloud.runtime.messages import ParameterError, errno_reason, one_line, worded
from ipycloud.runtime.storage.kaggle_credentials import (
    WEB,
    KaggleAuth,
    KaggleError,
    find_credentials,
    no_credentials,
)
from ipycloud.runtime.storage.mount import data_folder
from ipycloud.runtime.units import format_bytes

__all__ = ["KaggleError", "KaggleResult", "kaggle_download"]

MANIFEST = ".ipycloud-kaggle.json"
_SLUG = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")
_VERSION = re.compile(r"[1-9][0-9]{0,8}")


@dataclass(frozen=True)
class KaggleResult:
    """Where a Kaggle download lies: its folder, file count and size.

    ``skipped`` is True when the folder already held this download and nothing was
    requested; ``version`` is the dataset version (None for competitions).
    """

    path: Path
    handle: str
    files: int
    size: int
    skipped: bool
    version: int | None = None

    def summary(self) -> str:
        """One line: what, how much, where, and whether it was downloaded now."""
        what = self.handle
        if self.version is not None and "/versions/" not in what:
            what += f" (version {self.version})"
        state = "already there, skipped" if self.skipped else "downloaded"
        files = f"{self.files} file" + ("" if self.files == 1 else "s")
        return f"Kaggle {what}: {files}, {format_bytes(self.size)} in {self.path} ({state})"

    def __str__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())


@dataclass(frozen=True)
class _Handle:
    """A validated dataset or competition handle."""

    text: str
    slug: str
    owner: str | None = None  # None for a competition
    version: int | None = None

    @property
    def competition(self) -> bool:
        """Whether this is a competition slug rather than a dataset."""
        return self.owner is None

    @property
    def ref(self) -> str:
        """``OWNER/DATASET`` or the competition slug, without a version."""
        return self.slug if self.owner is None else f"{self.owner}/{self.slug}"

    @property
    def what(self) -> str:
        """How messages name it."""
        return f"competition {self.text}" if self.competition else f"dataset {self.text}"

    @property
    def page(self) -> str:
        """Its page on kaggle.com."""
        if self.competition:
            return f"{WEB}/competitions/{self.slug}"
        return f"{WEB}/datasets/{self.ref}"

    def kagglehub_handle(self, version: int | None) -> str:
        """The handle to give kagglehub, pinned to ``version`` when known."""
        if version is None or self.competition:
            return self.ref
        return f"{self.ref}/versions/{version}"

    def default_dest(self, data: Path) -> Path:
        """``<data>/kaggle/<owner>/<dataset>`` or ``<data>/kaggle/competitions/<slug>``."""
        base = data / "kaggle"
        if self.competition:
            return base / "competitions" / self.slug
        return base / str(self.owner) / self.slug


# -- handles and destinations ---------------------------------------------------------------
def _parse_handle(handle: object, competition: bool) -> _Handle:
    """Validate ``handle``; ValueError with the accepted forms when it is malformed."""
    if competition:
        if isinstance(handle, str) and _SLUG.fullmatch(handle):
            return _Handle(handle, handle)
        raise ValueError(f"invalid Kaggle competition {handle!r}: give its slug, as in "
                         f"{WEB}/competitions/<slug>, e.g. 'titanic'")
    parts = handle.split("/") if isinstance(handle, str) else []
    named = len(parts) in (2, 4) and all(_SLUG.fullmatch(p) for p in parts[:2])
    versioned = len(parts) == 4 and parts[2] == "versions" and _VERSION.fullmatch(parts[3])
    if named and (len(parts) == 2 or versioned):
        version = int(parts[3]) if len(parts) == 4 else None
        return _Handle(str(handle), parts[1], parts[0], version)
    raise ParameterError("invalid Kaggle dataset handle {handle}: use OWNER/DATASET or "
                         "OWNER/DATASET/versions/N (a competition: {competition})",
                         handle=repr(handle), competition="competition=True")


def _destination(h: _Handle, dest: str | os.PathLike[str] | None) -> Path:
    """``dest``, else the default folder in the mounted project (or the current folder).

    A destination that is a symlink stands for the folder it points to, which is kept.
    """
    if dest is not None:
        target = Path(dest).expanduser().absolute()
    else:
        target = h.default_dest(data_folder())
    return target.resolve() if target.is_symlink() else target.absolute()


# -- the manifest ---------------------------------------------------------------------------
def _read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest in ``folder`` when there is a well-formed one, else None."""
    try:
        data = json.loads((folder / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(
            isinstance(f, list) and len(f) == 2 and isinstance(f[0], str)
            and isinstance(f[1], int) for f in files):
        return None
    return data


def _complete(folder: Path, files: list[list[Any]]) -> bool:
    """Whether every listed file is in ``folder`` with its recorded size."""
    for name, size in files:
        try:
            if (folder / name).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def _ours(manifest: dict[str, Any] | None, h: _Handle) -> bool:
    """Whether ``manifest`` records a download of ``h`` (any version)."""
    return manifest is not None and manifest.get("handle") == h.ref and bool(
        manifest.get("competition")) == h.competition


def _skipped(target: Path, h: _Handle, manifest: dict[str, Any] | None) -> KaggleResult | None:
    """A skipped result when ``target``, whose manifest is given, holds a complete download
    of ``h``; else None."""
    if manifest is None or not _ours(manifest, h):
        return None
    version = manifest.get("version")
    if h.version is not None and version != h.version:
        return None
    if not _complete(target, manifest["files"]):
        return None
    size = sum(size for _, size in manifest["files"])
    return KaggleResult(target, h.text, len(manifest["files"]), size, True,
                        version if isinstance(version, int) else None)


def _check_target(target: Path, h: _Handle, force: bool,
                  manifest: dict[str, Any] | None) -> None:
    """Refuse a file, or a folder of other files (unless ``force``), as the destination."""
    if target.exists() and not target.is_dir():
        raise KaggleError(f"cannot download {h.what} into {target}: it is a file, not a folder")
    if force or not target.is_dir() or not any(target.iterdir()):
        return
    if not _ours(manifest, h):
        raise worded(KaggleError, "{target} already holds other files: choose another "
                     "{dest}, or pass {force} to replace them", target=str(target), dest="dest",
                     force="force=True")


# -- the download ---------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet(enabled: bool) -> Iterator[None]:
    """Hide kagglehub's progress bars (stderr) and info lines while ``enabled``."""
    if not enabled:
        yield
        return
    hub = logging.getLogger("kagglehub")
    level = hub.level
    hub.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        hub.setLevel(level)


def _within(path: Path, folder: Path) -> bool:
    """Whether ``path`` lies inside ``folder`` (both resolved)."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def _existing_parent(path: Path) -> Path:
    """``path`` or its nearest existing ancestor."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _copy_out(source: Path, staging: Path) -> None:
    """Copy a folder kagglehub does not own (a read-only mount), owner-writable."""
    shutil.copytree(source, staging, symlinks=True, copy_function=shutil.copyfile)
    for root, dirs, _ in os.walk(staging):
        for name in dirs:
            path = Path(root, name)
            path.chmod(path.stat().st_mode | 0o700)
    staging.chmod(staging.stat().st_mode | 0o700)


class _Job:
    """One download: ask about the size, let kagglehub fetch, move the files into place."""

    def __init__(self, h: _Handle, target: Path, auth: KaggleAuth, force: bool,
                 progress: bool) -> None:
        self.h, self.target, self.auth = h, target, auth
        self.force, self.progress = force, progress

    def run(self) -> KaggleResult:
        """The whole job; any failure becomes a scrubbed, one-line KaggleError."""
        error: KaggleError | None = None
        try:
            version, size = self.preflight()
            self.check_space(size)
            source = self.fetch(version)
            return self.place(source, version or _version_from(source))
        except KaggleError as caught:
            error = KaggleError(self.auth.scrub(str(caught)))
        except Exception as caught:  # kagglehub, requests and the file system
            error = self.translate(caught)
        raise error  # outside the handler: no chained exception holding a request

    def preflight(self) -> tuple[int | None, int | None]:
        """(version, total bytes) of a dataset from GetDataset; (None, None) otherwise.

        kagglehub would ask the same for an unversioned handle; it gets the version pinned
        so it does not ask again. Inside a Kaggle notebook kagglehub reads mounted inputs
        and the public API is not asked.
        """
        from kagglesdk.kaggle_env import is_in_kaggle_notebook

        if self.h.competition or is_in_kaggle_notebook():
            return self.h.version, None
        from kagglehub.clients import build_kaggle_client
        from kagglehub.exceptions import handle_call
        from kagglesdk.datasets.types.dataset_api_service import ApiGetDatasetRequest

        request = ApiGetDatasetRequest()
        request.owner_slug, request.dataset_slug = self.h.owner, self.h.slug
        with build_kaggle_client() as client:
            info = handle_call(lambda: client.datasets.dataset_api_client.get_dataset(request))
        current = info.current_version_number or None
        version = self.h.version or current
        size = info.total_bytes or None
        return version, size if version == current else None

    def check_space(self, size: int | None) -> None:
        """Refuse before downloading when the cache or destination cannot hold ``size``.

        The cache holds the archive and the extracted files at once (up to twice the size);
        a destination on another file system needs the size again.
        """
        if size is None:
            return
        from kagglehub.config import get_cache_folder

        cache = _existing_parent(Path(get_cache_folder()))
        dest = _existing_parent(self.target.parent)
        needs = [(cache, 2 * size)]
        if dest.stat().st_dev != cache.stat().st_dev:
            needs.append((dest, size))
        for folder, need in needs:
            free = shutil.disk_usage(folder).free
            if free < need:
                raise KaggleError(
                    f"not enough free space in {folder} for {self.h.what}: need "
                    f"{format_bytes(need)}, {format_bytes(free)} free; free some space, or "
                    "set KAGGLEHUB_CACHE / dest to a larger disk")

    def fetch(self, version: int | None) -> Path:
        """kagglehub's download of the whole bundle; the folder it answers with."""
        import kagglehub

        download = (kagglehub.competition_download if self.h.competition
                    else kagglehub.dataset_download)
        with _quiet(not self.progress):
            return Path(download(self.h.kagglehub_handle(version), force_download=self.force))

    def place(self, source: Path, version: int | None) -> KaggleResult:
        """Move (or copy) ``source`` beside the target, add the manifest, rename into place."""
        from kagglehub.config import get_cache_folder

        parent = self.target.parent
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(parent, self.target.name)
        staging = temp_name_for(self.target)
        try:
            if _within(source, Path(get_cache_folder())):
                shutil.move(source, staging)
            else:
                _copy_out(source, staging)
            files = [entry for entry in fsync_tree(staging) if entry[0] != MANIFEST]
            manifest = {"handle": self.h.ref, "competition": self.h.competition,
                        "version": version, "files": files}
            write_bytes_atomically(staging / MANIFEST, json.dumps(manifest, indent=1).encode())
            replace_folder(staging, self.target)
        except BaseException:
            with contextlib.suppress(OSError):
                remove_path(staging)
            raise
        size = sum(size for _, size in files)
        return KaggleResult(self.target, self.h.text, len(files), size, False, version)

    def translate(self, error: Exception) -> KaggleError:
        """A one-line, scrubbed KaggleError that says what to do about ``error``."""
        return KaggleError(self.auth.scrub(self.explain(error)))

    def explain(self, error: Exception) -> str:
        """What went wrong and what to do, by the kind of ``error``."""
        import requests
        from kagglehub.exceptions import DataCorruptionError, UnauthenticatedError

        response = getattr(error, "response", None)
        if isinstance(error, requests.HTTPError) and response is not None:
            return self.http_status(int(response.status_code))
        if isinstance(error, UnauthenticatedError):
            return no_credentials(self.h.what)
        if isinstance(error, DataCorruptionError):
            return (f"the archive of {self.h.what} failed its MD5 check and was deleted: "
                    "rerun to download it again")
        if isinstance(error, (requests.ConnectionError, requests.Timeout)):
            return (f"cannot reach Kaggle for {self.h.what} ({_reason(error)}): check the "
                    "network and rerun")
        if isinstance(error, requests.RequestException):
            return (f"the download of {self.h.what} was cut off ({_reason(error)}): rerun "
                    "to resume it from kagglehub's cache")
        if isinstance(error, OSError):
            return (f"cannot write {self.h.what} ({error.strerror or _reason(error)}): "
                    "check the free space and permissions, then rerun")
        return f"downloading {self.h.what} failed: {one_line(error)}"

    def http_status(self, status: int) -> str:
        """The message for an HTTP error status from Kaggle."""
        h, source = self.h, self.auth.source
        if status == 404:
            version = f"version {h.version} of " if h.version else ""
            return (f"Kaggle has no {version}{h.what} (HTTP 404): check the handle at "
                    f"{h.page}")
        if status in (401, 403) and source is None:
            return f"{no_credentials(h.what)} (HTTP {status})"
        if status == 401:
            return (f"Kaggle refused the credentials from {source} (HTTP 401): check the "
                    f"username and key, or create a new token at {WEB}/settings")
        if status == 403 and h.competition:
            return (f"Kaggle refused {h.what} (HTTP 403): accept the rules at {h.page}/rules "
                    f"with the account of {source}, then rerun")
        if status == 403:
            return (f"Kaggle refused {h.what} (HTTP 403): it is private or needs consent on "
                    f"{h.page}; check that the account of {source} may read it")
        return f"Kaggle answered HTTP {status} for {h.what}: rerun later"


def _reason(error: BaseException) -> str:
    """The innermost ``[Errno N] text`` of a requests error, else its type."""
    found = errno_reason(str(error))
    return f"[Errno {found[0]}] {found[1]}" if found else type(error).__name__


def _version_from(path: Path) -> int | None:
    """The version in kagglehub's cache path ``.../versions/<N>``, if it is one."""
    if path.parent.name == "versions" and path.name.isdigit():
        return int(path.name)
    return None


def _remove_stale(parent: Path, name: str) -> None:
    """Remove temporary folders of ``name`` left by runs that died."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            if entry.name.endswith(f"-{name}") and stale_temporary(entry.name):
                remove_path(entry)


def kaggle_download(
    handle: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    competition: bool = False,
    force: bool = False,
    progress: bool = True,
) -> KaggleResult:
    """Download a Kaggle dataset or a competition's data into a folder, atomically.

    ``handle`` is ``OWNER/DATASET`` or ``OWNER/DATASET/versions/N``; with
    ``competition=True`` it is the competition's slug. ``dest`` defaults to
    ``data/kaggle/<owner>/<dataset>`` (competitions: ``data/kaggle/competitions/<slug>``)
    in the folder ``mount()`` made, else in the current folder. A destination that already
    holds this download is returned with ``skipped=True`` and no request, unless ``force``.
    ``progress=False`` hides kagglehub's bars. Raises ValueError for a malformed handle
    (before any request), ImportError without kagglehub, and KaggleError (one line, no
    credentials in it) otherwise.
    """
    h = _parse_handle(handle, competition)
    target = _destination(h, dest)
    manifest = _read_manifest(target)
    if not force and (done := _skipped(target, h, manifest)) is not None:
        return done
    _check_target(target, h, force, manifest)
    require("kagglehub", "kaggle")
    auth = find_credentials()
    if h.competition and auth.source is None:
        raise KaggleError(no_credentials(h.what))
    return _Job(h, target, auth, force, progress).run()
