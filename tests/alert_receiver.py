"""A loopback receiver of alerts: what Apprise's ``json://127.0.0.1:PORT/path`` URLs post.

Use the ``alert_receiver`` fixture (``pytest_plugins`` in conftest.py names this module). A
path under ``/hang`` holds each request unanswered until ``release()``; every other path
answers 200, or after ``refuse(...)`` an error status with an error document as an ntfy
server writes it. ``messages`` are the JSON bodies received, ``held`` the requests held now.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        hang = self.path.startswith("/hang")
        with self.server.changed:
            self.server.messages.append({**body, "path": self.path})
            self.server.held += hang
            self.server.changed.notify_all()
        if hang:
            self.server.released.wait(60)
            with self.server.changed:
                self.server.held -= 1
                self.server.changed.notify_all()
        status, answer = self.server.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.messages: list[dict[str, Any]] = []
        self.held = 0
        self.changed = threading.Condition()
        self.released = threading.Event()
        self.answer = (200, b"")


class AlertReceiver:
    """A running receiver: its URLs, what it received, and the hold on ``/hang`` paths."""

    def __init__(self) -> None:
        self._httpd = _Server()
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, path: str = "alerts/s3cret-token") -> str:
        """The Apprise URL that posts to ``path`` here (its path stands for a secret)."""
        return f"json://127.0.0.1:{self._httpd.server_address[1]}/{path}"

    @property
    def messages(self) -> list[dict[str, Any]]:
        with self._httpd.changed:
            return list(self._httpd.messages)

    @property
    def held(self) -> int:
        with self._httpd.changed:
            return self._httpd.held

    def wait_for(self, condition: Callable[[AlertReceiver], bool], timeout: float = 30) -> None:
        """Wait until ``condition(self)`` holds; AssertionError after ``timeout`` seconds."""
        with self._httpd.changed:
            if not self._httpd.changed.wait_for(lambda: condition(self), timeout):
                raise AssertionError(f"the receiver got {self._httpd.messages}")

    def refuse(self, status: int, error: str) -> None:
        """Answer every later request with ``status`` and ``{"code": ..., "error": error}``
        (an ntfy server's error document)."""
        self._httpd.answer = (status, json.dumps({"code": status * 100 + 1,
                                                  "error": error}).encode())

    def release(self) -> None:
        """Answer the held requests, and every later one at once."""
        self._httpd.released.set()

    def stop(self) -> None:
        self.release()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def alert_receiver() -> Iterator[AlertReceiver]:
    """A started receiver, stopped after the test."""
    receiver = AlertReceiver()
    try:
        yield receiver
    finally:
        receiver.stop()
