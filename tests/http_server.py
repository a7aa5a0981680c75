"""A real HTTP server on 127.0.0.1 serving in-memory files, with per-path fault injection.

Use the ``http_server`` fixture (``from http_server import http_server``): it yields a
``LoopbackServer`` with ``.url(path)``, ``.add(path, data, **faults)`` and a ``.requests``
log, and shuts the server down after the test. A file can change between requests
(``Served.change``, or ``then=`` once a response has been cut), and can carry the
validators a resumed download needs (``etag=``, ``last_modified=``), honouring ``If-Range``
the way RFC 9110 says unless told not to.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

import pytest


@dataclass
class Served:
    """One file and its faults.

    drop_after: close the connection after sending this many body bytes of a response;
    only the first time unless ``drop_always``. ignore_range: answer 200 with the whole
    file to a Range request. corrupt: serve bytes that differ from ``data`` (same size).
    status: answer every request with this error status (e.g. 404, 503).
    disposition: a Content-Disposition header value.
    then: the file's new content once a response has been cut (it changed on the server
    while the client was away). etag: send a "strong" or "weak" ETag, which changes with the
    content. last_modified: send a Last-Modified date, one hour later at each change.
    ignore_if_range: answer a Range as if ``If-Range`` had not been sent (a server that
    does not implement it); otherwise a Range whose If-Range does not match the current
    strong ETag or Last-Modified gets the whole file with 200.
    """

    data: bytes
    drop_after: int | None = None
    drop_always: bool = False
    ignore_range: bool = False
    corrupt: bool = False
    status: int | None = None
    disposition: str | None = None
    then: bytes | None = None
    etag: Literal["strong", "weak"] | None = None
    last_modified: bool = False
    ignore_if_range: bool = False
    drops: int = 0
    version: int = 0

    def change(self, data: bytes) -> None:
        """Give the file new content (a new version, with new validators)."""
        self.data = data
        self.version += 1

    def validators(self) -> dict[str, str]:
        """The ETag and Last-Modified headers this version is served with."""
        headers = {}
        if self.etag is not None:
            tag = f'"v{self.version}-{hashlib.sha256(self.body()).hexdigest()[:16]}"'
            headers["ETag"] = tag if self.etag == "strong" else f"W/{tag}"
        if self.last_modified:
            when = 1_704_067_200 + 3600 * self.version  # 2024-01-01 00:00 UTC, then hourly
            headers["Last-Modified"] = email.utils.formatdate(when, usegmt=True)
        return headers

    def honours_range(self, if_range: str | None) -> bool:
        """Whether a Range request with this If-Range value gets a part (206)."""
        if self.ignore_range:
            return False
        if if_range is None or self.ignore_if_range:
            return True
        strong = {v for k, v in self.validators().items() if not v.startswith("W/")}
        return if_range in strong

    def body(self) -> bytes:
        """The bytes actually served."""
        if not self.corrupt or not self.data:
            return self.data
        return bytes([self.data[0] ^ 0xFF]) + self.data[1:]

    def drop_limit(self) -> int | None:
        """How many body bytes this response may send before the connection is cut."""
        if self.drop_after is None or (self.drops and not self.drop_always):
            return None
        self.drops += 1
        return self.drop_after

    def after_drop(self) -> None:
        """Apply ``then`` once the first response has been cut."""
        if self.then is not None:
            self.change(self.then)
            self.then = None


@dataclass
class Logged:
    """One request as the server saw it."""

    method: str
    path: str
    range: str | None
    status: int
    sent: int
    headers: dict[str, str] = field(default_factory=dict)


def _parse_range(value: str, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) for ``bytes=a-`` or ``bytes=a-b``; None if unsatisfiable."""
    spec = value.strip().removeprefix("bytes=")
    first, _, last = spec.partition("-")
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    return (start, end) if start < size and start <= end else None


class _Handler(BaseHTTPRequestHandler):
    """Serves ``server.files``; bounded by a socket timeout."""

    server: _Server
    timeout = 10

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet."""

    def do_HEAD(self) -> None:
        """Headers only."""
        self.tracked(head=True)

    def do_GET(self) -> None:
        """Headers and (a possibly cut) body."""
        self.tracked(head=False)

    def tracked(self, head: bool) -> None:
        """Respond while counted as busy, so the log is complete once the server is idle."""
        with self.server.idle:
            self.server.busy += 1
        try:
            self.respond(head)
        finally:
            with self.server.idle:
                self.server.busy -= 1
                self.server.idle.notify_all()

    def log(self, status: int, sent: int) -> None:
        path = urllib.parse.urlsplit(self.path).path
        entry = Logged(self.command, path, self.headers.get("Range"), status, sent,
                       dict(self.headers.items()))
        with self.server.lock:
            self.server.log.append(entry)

    def respond(self, head: bool) -> None:
        path = urllib.parse.urlsplit(self.path).path
        with self.server.lock:
            served = self.server.files.get(path)
            limit = served.drop_limit() if served is not None and not head else None
        if served is None or served.status is not None:
            code = 404 if served is None else served.status or 404
            self.send_error(code)
            self.log(code, 0)
            return
        rng = self.headers.get("Range")
        with self.server.lock:
            body, validators = served.body(), served.validators()
            partial = served.honours_range(self.headers.get("If-Range"))
            if limit is not None:
                served.after_drop()  # the next request sees the new version
        start, end, code = 0, len(body) - 1, 200
        if rng and partial:
            bounds = _parse_range(rng, len(body))
            if bounds is None:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                self.log(416, 0)
                return
            (start, end), code = bounds, 206
        payload = body[start:end + 1]
        self.send_response(code)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Accept-Ranges", "bytes")
        if code == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(body)}")
        if served.disposition:
            self.send_header("Content-Disposition", served.disposition)
        for name, value in validators.items():
            self.send_header(name, value)
        self.end_headers()
        self.log(code, 0 if head else self.send_body(payload, limit))

    def send_body(self, payload: bytes, limit: int | None) -> int:
        """Write the body (cut at ``limit``); returns bytes written."""
        chunk = payload if limit is None else payload[:limit]
        try:
            self.wfile.write(chunk)
            self.wfile.flush()
        except OSError:
            return 0
        if limit is not None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        return len(chunk)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, Served] = {}
        self.log: list[Logged] = []
        self.lock = threading.Lock()
        self.idle = threading.Condition()
        self.busy = 0


class LoopbackServer:
    """A running loopback server: add files, build URLs, read the request log."""

    def __init__(self) -> None:
        self._httpd = _Server()
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def requests(self) -> list[Logged]:
        """A copy of the request log, oldest first, once no request is in progress."""
        with self._httpd.idle:
            self._httpd.idle.wait_for(lambda: self._httpd.busy == 0, timeout=5)
        with self._httpd.lock:
            return list(self._httpd.log)

    def url(self, path: str) -> str:
        """The full URL of ``path`` on this server."""
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def add(self, path: str, data: bytes, **faults: object) -> Served:
        """Serve ``data`` at ``path`` with the given faults (see ``Served``)."""
        served = Served(data, **faults)  # type: ignore[arg-type]
        with self._httpd.lock:
            self._httpd.files["/" + path.lstrip("/")] = served
        return served

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def http_server() -> Iterator[LoopbackServer]:
    """A started loopback server, stopped after the test."""
    server = LoopbackServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
