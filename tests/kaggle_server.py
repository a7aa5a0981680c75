"""A loopback fake of the Kaggle API calls kagglehub makes, on tests/http_server's server.

kagglehub (through kagglesdk) has no free endpoint setting: ``KAGGLE_API_ENVIRONMENT``
picks one of a few fixed hosts, ``LOCALHOST`` being ``http://localhost`` (API under
``/api/v1``). The ``kaggle_server`` fixture selects it and points requests' standard
``http_proxy``/``https_proxy`` at this server, so every request kagglehub makes arrives
here on an ephemeral port of 127.0.0.1: the API calls for ``localhost``, the redirected
archive download for the fake storage host, and resumed downloads. Nothing leaves the
machine. The fixture also gives HOME, the kagglehub cache and the Kaggle config folder
temporary paths, and clears every Kaggle variable.

Answered (the bodies are kagglesdk's JSON field names):

- ``POST /api/v1/datasets.DatasetApiService/GetDataset`` ``{ownerSlug, datasetSlug}``:
  ``{"ref", "currentVersionNumber", "totalBytes"}``
- ``POST /api/v1/datasets.DatasetApiService/DownloadDataset``
  ``{ownerSlug, datasetSlug, datasetVersionNumber}``: 302 to the archive on storage
- ``POST /api/v1/competitions.CompetitionApiService/DownloadDataFiles``
  ``{competitionName}``: 302 to the archive on storage
- ``GET http://storage.kaggle.test/...``: the archive with Content-Length,
  ``Accept-Ranges: bytes``, ``x-goog-hash: md5=<base64>`` and Last-Modified; ``Range``
  gives 206; the faults of ``http_server.Served`` (``drop_after``, ``status``...) apply.

Errors are kagglesdk-style JSON ``{"code": N, "message": ...}``: 401 for a wrong key,
403 for a private dataset without its owner's key or a competition whose rules the user
has not accepted (401 when anonymous), 404 for anything unknown.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import socket
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from http_server import LoopbackServer, _Handler, _Server

API = "/api/v1/"
STORAGE_HOST = "storage.kaggle.test"
LAST_MODIFIED = "Mon, 01 Jan 2024 00:00:00 GMT"


def make_zip(files: dict[str, bytes]) -> bytes:
    """A zip archive holding ``files`` (name -> content)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@dataclass
class Dataset:
    """One dataset: its versions' storage paths, who may read it, what GetDataset says."""

    owner: str
    private: bool = False
    versions: dict[int, str] = field(default_factory=dict)
    total_bytes: int | None = None


@dataclass
class Competition:
    """One competition: its storage path and the users who accepted its rules."""

    path: str
    accepted: set[str] = field(default_factory=set)


@dataclass
class ApiCall:
    """One API call as the server saw it: method name, JSON body, Basic user, status."""

    name: str
    body: dict[str, object]
    user: str | None
    status: int


class _KaggleHandler(_Handler):
    """http_server's file handler plus the Kaggle API (POST) and storage headers."""

    server: _KaggleHTTPD

    def do_POST(self) -> None:
        """An API call."""
        self.tracked(head=False)

    def respond(self, head: bool) -> None:
        if self.command == "POST":
            self.api()
        else:
            super().respond(head)

    def end_headers(self) -> None:
        """Add the storage headers (x-goog-hash, Last-Modified) to a served archive."""
        path = urllib.parse.urlsplit(self.path).path
        digest = self.server.md5.get(path)
        if self.command in ("GET", "HEAD") and digest is not None:
            self.send_header("x-goog-hash", f"crc32c=AAAAAA==,md5={digest}")
            self.send_header("Last-Modified", LAST_MODIFIED)
        super().end_headers()

    # -- the API ---------------------------------------------------------------------
    def api(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        body = json.loads(raw or b"{}")
        path = urllib.parse.urlsplit(self.path).path
        name = path.removeprefix("/api").removeprefix("/v1/")
        user, valid = self.basic_user()
        with self.server.lock:
            status, answer = (401, "Unauthenticated") if not valid else self.route(name, body, user)
            self.server.calls.append(ApiCall(name, body, user, status))
        if status == 302:
            self.send_response(302)
            self.send_header("Location", str(answer))
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.log(302, 0)
            return
        payload = answer if status == 200 else {"code": status, "message": answer}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.log(status, len(data))

    def basic_user(self) -> tuple[str | None, bool]:
        """(user, credentials valid): (None, True) when anonymous."""
        value = self.headers.get("Authorization")
        if value is None:
            return None, True
        scheme, _, token = value.partition(" ")
        try:
            user, _, key = base64.b64decode(token).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None, False
        return user, scheme == "Basic" and self.server.users.get(user) == key

    def route(self, name: str, body: dict[str, object], user: str | None) -> tuple[int, object]:
        """(status, JSON answer or redirect URL) for one API call."""
        if name == "datasets.DatasetApiService/GetDataset":
            return self.get_dataset(body, user)
        if name == "datasets.DatasetApiService/DownloadDataset":
            return self.download_dataset(body, user)
        if name == "competitions.CompetitionApiService/DownloadDataFiles":
            return self.download_competition(body, user)
        return 404, f"no such method {name}"

    def dataset(self, body: dict[str, object], user: str | None) -> tuple[int, object]:
        ref = f"{body.get('ownerSlug')}/{body.get('datasetSlug')}"
        found = self.server.datasets.get(ref)
        if found is None:
            return 404, "Not found"
        if found.private and user != found.owner:
            return 403, "Permission 'datasets.get' was denied"
        return 200, found

    def get_dataset(self, body: dict[str, object], user: str | None) -> tuple[int, object]:
        status, found = self.dataset(body, user)
        if not isinstance(found, Dataset):
            return status, found
        answer: dict[str, object] = {"ref": f"{body['ownerSlug']}/{body['datasetSlug']}",
                                     "currentVersionNumber": max(found.versions)}
        if found.total_bytes is not None:
            answer["totalBytes"] = found.total_bytes
        return 200, answer

    def download_dataset(self, body: dict[str, object], user: str | None) -> tuple[int, object]:
        status, found = self.dataset(body, user)
        if not isinstance(found, Dataset):
            return status, found
        version = body.get("datasetVersionNumber")
        path = found.versions.get(version) if isinstance(version, int) else None
        if path is None:
            return 404, f"Version {version} not found"
        return 302, f"http://{STORAGE_HOST}{path}?X-Goog-Signature=signed"

    def download_competition(self, body: dict[str, object], user: str | None) -> tuple[int, object]:
        found = self.server.competitions.get(str(body.get("competitionName")))
        if found is None:
            return 404, "Competition not found"
        if user is None:
            return 401, "Unauthenticated"
        if user not in found.accepted:
            return 403, "You must accept this competition's rules before you can continue"
        return 302, f"http://{STORAGE_HOST}{found.path}?X-Goog-Signature=signed"


class _KaggleHTTPD(_Server):
    def __init__(self) -> None:
        super().__init__()
        self.RequestHandlerClass = _KaggleHandler
        self.users: dict[str, str] = {}
        self.datasets: dict[str, Dataset] = {}
        self.competitions: dict[str, Competition] = {}
        self.md5: dict[str, str] = {}
        self.calls: list[ApiCall] = []


class KaggleServer(LoopbackServer):
    """The fake Kaggle: register users, datasets and competitions; read the logs."""

    _httpd: _KaggleHTTPD

    def __init__(self) -> None:  # LoopbackServer's, with the Kaggle server in it
        self._httpd = _KaggleHTTPD()
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def proxy(self) -> str:
        """The URL to give requests as its HTTP(S) proxy."""
        return f"http://127.0.0.1:{self.port}"

    def add_user(self, username: str, key: str) -> None:
        """Accept Basic credentials ``username:key``."""
        with self._httpd.lock:
            self._httpd.users[username] = key

    def add_archive(self, path: str, archive: bytes, **faults: object) -> str:
        """Serve ``archive`` on storage at ``path`` with its MD5 header; returns the path."""
        path = "/" + path.lstrip("/")
        self.add(path, archive, **faults)
        with self._httpd.lock:
            self._httpd.md5[path] = base64.b64encode(hashlib.md5(archive).digest()).decode()
        return path

    def add_dataset(self, handle: str, archive: bytes, *, version: int = 1,
                    private: bool = False, total_bytes: int | None = None,
                    **faults: object) -> None:
        """Serve ``archive`` as version ``version`` of ``OWNER/DATASET``."""
        owner = handle.split("/")[0]
        path = self.add_archive(f"datasets/{handle}/{version}.zip", archive, **faults)
        with self._httpd.lock:
            found = self._httpd.datasets.setdefault(handle, Dataset(owner))
            found.versions[version] = path
            found.private = private
            found.total_bytes = total_bytes

    def add_competition(self, slug: str, archive: bytes, *, accepted: tuple[str, ...] = (),
                        **faults: object) -> None:
        """Serve ``archive`` as the data of competition ``slug``; ``accepted``: rules."""
        path = self.add_archive(f"competitions/{slug}.zip", archive, **faults)
        with self._httpd.lock:
            self._httpd.competitions[slug] = Competition(path, set(accepted))

    @property
    def calls(self) -> list[ApiCall]:
        """The API calls so far, oldest first."""
        self.requests  # noqa: B018 - waits until no request is in progress
        with self._httpd.lock:
            return list(self._httpd.calls)


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def kaggle_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[KaggleServer]:
    """A started fake Kaggle that kagglehub talks to, with HOME and caches under tmp_path."""
    import kagglehub.config

    home = tmp_path / "home"
    home.mkdir()
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_CONFIG_DIR", "KAGGLE_API_TOKEN",
                 "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_DATA_PROXY_URL", "TBE_RUNTIME_ADDR",
                 "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    server = KaggleServer()
    monkeypatch.setenv("KAGGLE_API_ENVIRONMENT", "LOCALHOST")
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, server.proxy)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "kagglehub-cache"))
    # kagglehub computed its defaults from the real HOME when first imported: follow ours.
    monkeypatch.setattr(kagglehub.config, "DEFAULT_KAGGLE_CREDENTIALS_FOLDER",
                        str(home / ".kaggle"))
    monkeypatch.setattr(kagglehub.config, "DEFAULT_CACHE_FOLDER",
                        str(home / ".cache" / "kagglehub"))
    kagglehub.config.clear_kaggle_credentials()
    monkeypatch.chdir(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
