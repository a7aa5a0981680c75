"""A loopback fake of the Google Drive web endpoints gdown uses, behind an HTTPS proxy.

gdown talks to Drive through ``requests``, which honours ``HTTPS_PROXY`` and
``REQUESTS_CA_BUNDLE``. The ``gdrive_server`` fixture (``from gdrive_server import
gdrive_server``) starts a proxy on 127.0.0.1 that answers ``CONNECT`` for the Google hosts
only, terminates TLS with a certificate for them signed by a throwaway CA (made with
``cryptography``), and serves fake Drive pages over the tunnel. It points the environment
at the proxy and the CA (``NO_PROXY`` removed, so nothing bypasses it) and yields a
``FakeDrive``: ``.add_file(...)``, ``.add_folder(...)`` and a ``.requests`` log.

Endpoints, as gdown 6 requests them:

- ``drive.google.com/uc?id=ID``: 303 to ``drive.usercontent.google.com/download?id=ID&
  export=download``; 404 page for an unknown ID.
- ``drive.usercontent.google.com/download``: the bytes (Content-Disposition, ETag, Range
  with If-Range); for ``virus_scan`` files first the "can't scan for viruses" page whose
  ``#download-form`` adds ``confirm`` and ``uuid``; for ``access="private"`` a 302 to the
  Google sign-in page; for ``access="quota"`` the "Too many users" error page.
- ``drive.google.com/embeddedfolderview?id=ID``: a folder listing (title = folder name,
  ``/file/d/ID/view`` and ``/drive/folders/ID`` links), or the sign-in redirect.
- ``accounts.google.com/ServiceLogin``: a sign-in page.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import html
import ipaddress
import secrets
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

HOSTS = ("drive.google.com", "drive.usercontent.google.com", "docs.google.com",
         "accounts.google.com")
USERCONTENT = "https://drive.usercontent.google.com"
SIGN_IN = "https://accounts.google.com/ServiceLogin?service=wise&passive=1209600"
CHUNK = 64 * 1024


@dataclass
class DriveFile:
    """A file on the fake Drive, and its faults.

    virus_scan: answer the first download with the confirmation page. access: "public",
    "private" (redirect to sign-in) or "quota" (the "Too many users" page). drop_after:
    cut the connection after this many body bytes, for the first ``drops`` responses that
    send bytes. corrupt: serve bytes that differ from ``data`` (same size).
    """

    id: str
    name: str
    data: bytes
    virus_scan: bool = False
    access: str = "public"
    drop_after: int | None = None
    drops: int = 1
    corrupt: bool = False
    uuid: str = field(default_factory=lambda: secrets.token_hex(8))

    @property
    def etag(self) -> str:
        return '"' + hashlib.sha256(self.data).hexdigest()[:16] + '"'

    def body(self) -> bytes:
        """The bytes actually served."""
        if not self.corrupt or not self.data:
            return self.data
        return bytes([self.data[0] ^ 0xFF]) + self.data[1:]

    def drop_limit(self) -> int | None:
        """How many body bytes this response may send before the connection is cut."""
        if self.drop_after is None or self.drops <= 0:
            return None
        self.drops -= 1
        return self.drop_after


@dataclass
class DriveFolder:
    """A folder on the fake Drive: its name, children (file and folder IDs) and access."""

    id: str
    name: str
    children: list[str]
    access: str = "public"


@dataclass
class Logged:
    """One request as the fake Drive saw it (CONNECTs have method "CONNECT")."""

    method: str
    host: str
    path: str
    query: dict[str, str]
    range: str | None
    if_range: str | None
    status: int
    sent: int = 0


def new_id() -> str:
    """A Drive-like ID: 33 characters of [A-Za-z0-9_-], starting with 1."""
    return "1" + secrets.token_urlsafe(24)[:32]


# -- pages ---------------------------------------------------------------------------------
def _page(title: str, body: str) -> bytes:
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title></head><body>{body}</body></html>").encode()


def _virus_scan_page(f: DriveFile) -> bytes:
    """Drive's warning for files too large to scan: one line, as Google minifies it."""
    inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in
                     (("id", f.id), ("export", "download"), ("confirm", "t"), ("uuid", f.uuid)))
    return _page("Google Drive - Virus scan warning",
                 '<div class="uc-main"><p class="uc-warning-caption">Google Drive can\'t scan '
                 f"this file for viruses.</p><p>{html.escape(f.name)} ({len(f.data)} bytes) is "
                 "too large for Google to scan for viruses. Would you still like to download "
                 f'this file?</p><form id="download-form" action="{USERCONTENT}/download" '
                 f'method="get"><input type="submit" id="uc-download-link" value="Download '
                 f'anyway">{inputs}</form></div>')


def _quota_page() -> bytes:
    return _page("Google Drive - Quota exceeded",
                 '<div class="uc-main"><p class="uc-error-caption">Sorry, you can\'t view or '
                 'download this file at this time.</p><p class="uc-error-subcaption">Too many '
                 "users have viewed or downloaded this file recently. Please try accessing the "
                 "file again later. If the file you are trying to access is particularly large "
                 "or is shared with many people, it may take up to 24 hours to be able to view "
                 "or download the file.</p></div>")


def _folder_page(folder: DriveFolder, drive: FakeDrive) -> bytes:
    """The embedded folder view: one entry per child, linking the file or folder."""
    entries = []
    for child in folder.children:
        if child in drive.folders:
            href, name = (f"https://drive.google.com/drive/folders/{child}",
                          drive.folders[child].name)
        else:
            href, name = (f"https://drive.google.com/file/d/{child}/view?usp=drive_web",
                          drive.files[child].name)
        entries.append(f'<div class="flip-entry" id="entry-{child}"><a href="{href}" '
                       'target="_blank"><div class="flip-entry-thumb"></div><div '
                       f'class="flip-entry-title">{html.escape(name)}</div></a></div>')
    return _page(folder.name, '<div class="flip-entries">' + "\n".join(entries) + "</div>")


def _not_found_page() -> bytes:
    return _page("Google Drive - 404",
                 "<p>Sorry, the file you have requested does not exist.</p>"
                 "<p>Make sure that you have the correct URL and the file exists.</p>")


def _parse_range(value: str, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) for ``bytes=a-`` or ``bytes=a-b``; None if unsatisfiable."""
    first, _, last = value.strip().removeprefix("bytes=").partition("-")
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    return (start, end) if start < size and start <= end else None


# -- serving ---------------------------------------------------------------------------------
class _DriveHandler(BaseHTTPRequestHandler):
    """Serves the Drive endpoints over one TLS tunnel (keep-alive: many requests)."""

    server: _Proxy
    protocol_version = "HTTP/1.1"
    timeout = 10

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet."""

    def do_GET(self) -> None:
        with self.server.idle:
            self.server.busy += 1
        try:
            self.route()
        finally:
            with self.server.idle:
                self.server.busy -= 1
                self.server.idle.notify_all()

    @property
    def host(self) -> str:
        return (self.headers.get("Host") or "").split(":")[0].lower()

    def log(self, status: int, sent: int = 0) -> None:
        parts = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        entry = Logged("GET", self.host, parts.path, query, self.headers.get("Range"),
                       self.headers.get("If-Range"), status, sent)
        with self.server.lock:
            self.server.log.append(entry)

    def route(self) -> None:
        parts = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        drive = self.server.drive
        key = (self.host, parts.path)
        if key == ("drive.google.com", "/uc") and query.get("id") in drive.files:
            target = f"{USERCONTENT}/download?id={query['id']}&export=download"
            self.reply(303, b"", headers={"Location": target})
        elif key == ("drive.usercontent.google.com", "/download") and query.get("id") in (
                drive.files):
            self.download(drive.files[query["id"]], query)
        elif key == ("drive.google.com", "/embeddedfolderview") and query.get("id") in (
                drive.folders):
            folder = drive.folders[query["id"]]
            if folder.access == "private":
                self.reply(302, b"", headers={"Location": SIGN_IN})
            else:
                self.reply(200, _folder_page(folder, drive), "text/html; charset=utf-8")
        elif key == ("accounts.google.com", "/ServiceLogin"):
            self.reply(200, _page("Sign in - Google Accounts", "<form>Email</form>"),
                       "text/html; charset=utf-8")
        else:
            self.reply(404, _not_found_page(), "text/html; charset=utf-8")

    def download(self, f: DriveFile, query: dict[str, str]) -> None:
        if f.access == "private":
            self.reply(302, b"", headers={"Location": SIGN_IN})
        elif f.access == "quota":
            self.reply(200, _quota_page(), "text/html; charset=utf-8")
        elif f.virus_scan and (query.get("confirm") != "t" or query.get("uuid") != f.uuid):
            self.reply(200, _virus_scan_page(f), "text/html; charset=utf-8")
        else:
            self.send_file(f)

    def send_file(self, f: DriveFile) -> None:
        body = f.body()
        rng, if_range = self.headers.get("Range"), self.headers.get("If-Range")
        start, end, code = 0, len(body) - 1, 200
        if rng and (if_range is None or if_range == f.etag):
            bounds = _parse_range(rng, len(body))
            if bounds is None:
                self.reply(416, b"", headers={"Content-Range": f"bytes */{len(body)}"})
                return
            (start, end), code = bounds, 206
        quoted = urllib.parse.quote(f.name)
        headers = {"Content-Disposition": f"attachment; filename=\"{f.name}\"; "
                                          f"filename*=UTF-8''{quoted}",
                   "ETag": f.etag, "Accept-Ranges": "bytes"}
        if code == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
        with self.server.lock:
            limit = f.drop_limit()
        self.reply(code, body[start:end + 1], "application/octet-stream", headers, limit)

    def reply(self, code: int, body: bytes, kind: str = "text/html; charset=utf-8",
              headers: dict[str, str] | None = None, limit: int | None = None) -> None:
        """Send a response; with ``limit``, cut the connection after that many body bytes."""
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        payload = body if limit is None else body[:limit]
        sent = 0
        try:
            for at in range(0, len(payload), CHUNK):
                self.wfile.write(payload[at:at + CHUNK])
                sent += len(payload[at:at + CHUNK])
        except OSError:  # the client closed the connection
            self.close_connection = True
        self.log(code, sent)
        if limit is not None:
            self.close_connection = True
            self.hang_up()

    def hang_up(self) -> None:
        """Close the tunnel cleanly (TLS close_notify, then FIN), as a dropping server does."""
        conn = self.connection
        with contextlib.suppress(OSError, ValueError):
            conn.settimeout(2)
            if isinstance(conn, ssl.SSLSocket):
                conn = conn.unwrap()
            conn.shutdown(socket.SHUT_RDWR)


class _ProxyHandler(BaseHTTPRequestHandler):
    """Answers CONNECT for the Google hosts and serves the fake Drive inside the tunnel."""

    server: _Proxy
    timeout = 10

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet."""

    def connect_log(self, status: int) -> None:
        with self.server.lock:
            self.server.log.append(Logged("CONNECT", self.path, "", {}, None, None, status))

    def do_CONNECT(self) -> None:
        host, _, port = self.path.rpartition(":")
        self.close_connection = True
        if host.lower() not in HOSTS or port != "443":
            self.connect_log(403)
            self.send_error(403, "this test proxy only reaches the fake Google Drive")
            return
        self.connect_log(200)
        self.send_response(200, "Connection Established")
        self.end_headers()
        try:
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (OSError, ssl.SSLError):
            return
        try:
            _DriveHandler(tls, self.client_address, self.server)
        except OSError:
            pass
        finally:
            tls.close()

    def do_GET(self) -> None:
        """Plain-HTTP proxying is refused: gdown only uses https."""
        with self.server.lock:
            self.server.log.append(Logged("GET", "", self.path, {}, None, None, 403))
        self.send_error(403, "this test proxy only tunnels https")


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, drive: FakeDrive, tls: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.drive = drive
        self.tls = tls
        self.log: list[Logged] = []
        self.lock = threading.Lock()
        self.idle = threading.Condition()
        self.busy = 0


# -- certificates ------------------------------------------------------------------------
def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for HOSTS: (ca.pem, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ipycloud test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in HOSTS]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class FakeDrive:
    """The running proxy and its fake Drive: add files and folders, read the request log."""

    def __init__(self, certs: tuple[Path, Path, Path]) -> None:
        self.ca = certs[0]
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(certs[1], certs[2])
        self.files: dict[str, DriveFile] = {}
        self.folders: dict[str, DriveFolder] = {}
        self._proxy = _Proxy(self, tls)
        self._thread = threading.Thread(target=self._proxy.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self._proxy.server_address[1]}"

    def add_file(self, name: str, data: bytes, **faults: object) -> DriveFile:
        """Put a file on the fake Drive (faults: see DriveFile); returns it, with its id."""
        f = DriveFile(new_id(), name, data, **faults)  # type: ignore[arg-type]
        with self._proxy.lock:
            self.files[f.id] = f
        return f

    def add_folder(self, name: str, children: list[str], access: str = "public") -> str:
        """Put a folder listing ``children`` (file or folder IDs) on the fake Drive."""
        folder = DriveFolder(new_id(), name, list(children), access)
        with self._proxy.lock:
            self.folders[folder.id] = folder
        return folder.id

    @property
    def requests(self) -> list[Logged]:
        """The GET requests served inside the tunnels, oldest first, once none is running."""
        return [e for e in self.log if e.method != "CONNECT"]

    @property
    def log(self) -> list[Logged]:
        """Every CONNECT and GET, oldest first, once no request is in progress."""
        with self._proxy.idle:
            self._proxy.idle.wait_for(lambda: self._proxy.busy == 0, timeout=5)
        with self._proxy.lock:
            return list(self._proxy.log)

    def clear(self) -> None:
        """Forget the requests logged so far."""
        with self._proxy.lock:
            self._proxy.log.clear()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._proxy.shutdown()
        self._proxy.server_close()
        self._thread.join(timeout=5)


@pytest.fixture(scope="session")
def drive_certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_certificates(tmp_path_factory.mktemp("gdrive-tls"))


@pytest.fixture
def gdrive_server(drive_certificates: tuple[Path, Path, Path],
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDrive]:
    """A started fake Drive that requests (hence gdown) reach via HTTPS_PROXY."""
    drive = FakeDrive(drive_certificates)
    drive.start()
    for name in ("no_proxy", "NO_PROXY", "CURL_CA_BUNDLE", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, drive.proxy_url)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(drive.ca))
    for host in HOSTS:  # nothing may go to the real Google
        proxies = requests.utils.get_environ_proxies(f"https://{host}/uc")
        assert proxies.get("https") == drive.proxy_url, proxies
    try:
        yield drive
    finally:
        drive.stop()
