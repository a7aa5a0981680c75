"""The dashboard page a kernel serves itself, so it stays live while a cell runs and where
widget updates sent from a thread are not drawn (Colab).

One HTTP server per process, on a daemon thread, listening on 127.0.0.1 at a free port.
Every request carries the server's random token, as ``?token=`` or an ``Authorization:
token <token>`` header; any other is answered 403. Its routes:

- ``/``: the page (one HTML file with its script and style inline, built from
  ``labextension/src/page/`` into ``ipycloud/monitor_page/``);
- ``/api/reading`` and ``/api/history?since=T``: the shared sampler's newest reading and
  the readings it keeps after T, as the Jupyter server extension's routes of the same names
  answer them (``ipycloud/server/README.md``);
- ``/api/runs`` and ``/api/runs/<id>?since=T``: this process's runs of ``fit`` and one
  run's records after T, read from their run records, as the server's routes answer them.

``HEAD`` is answered as ``GET`` without the body; any other method with a 405 and an
``Allow`` header. Every error is the API's JSON, ``{"message": "<one line>"}``.

Each connection is served on a thread of its own (``http_connections``) from what the
sampler thread already read, so nothing waits for the kernel's main thread; the server holds
a subscription on the sampler, at its interval, while it runs. A page keeps its connection
between polls (HTTP/1.1), and each reading is encoded once however many pages ask for it.
"""

from __future__ import annotations

import functools
import hmac
import io
import json
import logging
import os
import secrets
import threading
import weakref
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from ipycloud.runtime.monitor import route_bodies
from ipycloud.runtime.monitor.http_connections import ConnectionsServer
from ipycloud.runtime.monitor.page_runs import NoSuchRun, run_answer, runs_answer
from ipycloud.runtime.monitor.sampler import (
    DEFAULT_INTERVAL_S,
    VIEW_MIN_INTERVAL_S,
    Sampler,
    Subscription,
    check_interval,
    shared_sampler,
)
from ipycloud.runtime.monitor.samples import Sample
from ipycloud.runtime.per_process import per_process

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
PAGE = ("monitor_page", "index.html")  # in the ipycloud package, once it is built
# Where a Jupyter server with ipycloud's extension serves the same page (its path from the
# server's origin), in the environment of the kernels it starts.
SERVER_PAGE_ENV = "IPYCLOUD_SERVER_PAGE"
REQUEST_TIMEOUT_S = 10.0  # a connection that sends nothing for this long is closed
_POLL_S = 0.5  # how often the serving thread looks for a stop request

Answer = tuple[int, str, bytes]  # status, content type, body
JSON = "application/json"
ALLOWED_METHODS = "GET, HEAD"


class PageServer:
    """The dashboard page's HTTP server on ``sampler``'s readings; ``start()`` it.

    ``interval`` is the seconds between the readings it asks the sampler for, which the
    page follows as its polling pace.
    """

    def __init__(self, sampler: Sampler, interval: float = DEFAULT_INTERVAL_S) -> None:
        self.sampler = sampler
        self.interval = check_interval(interval, minimum=VIEW_MIN_INTERVAL_S)
        self.token = secrets.token_urlsafe(32)
        self._lock = threading.Lock()
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._subscription: Subscription | None = None
        self._reading: tuple[Sample, float, bytes] | None = None  # the last one encoded

    @property
    def running(self) -> bool:
        """Whether the server listens."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def port(self) -> int:
        """The port it listens on, or did until stopped (ValueError before ``start()``)."""
        if self._http is None:
            raise ValueError("the dashboard page's server is not running")
        return int(self._http.server_address[1])

    def path(self, history: float | None = None) -> str:
        """The page's path with the token, and the seconds its sparklines reach back."""
        query = {"token": self.token}
        if history is not None:
            query["history"] = f"{history:g}"
        return f"/?{urlencode(query)}"

    def url(self, history: float | None = None) -> str:
        """The page's address on this machine."""
        return f"http://{HOST}:{self.port}{self.path(history)}"

    def start(self) -> PageServer:
        """Listen on a free port and hold a subscription on the sampler; harmless when
        running."""
        with self._lock:
            if self.running:
                return self
            http = _HttpServer((HOST, 0), _Handler)
            http.page = self
            self._subscription = self.sampler.subscribe(_keep_sampling,
                                                        interval=self.interval)
            self._thread = threading.Thread(target=http.serve_forever, args=(_POLL_S,),
                                            name="ipycloud-page", daemon=True)
            self._http = http
            self._thread.start()
            _listening.add(self)
        return self

    def follow(self, interval: float) -> None:
        """Ask the sampler for a reading every ``interval`` seconds from now on."""
        interval = check_interval(interval, minimum=VIEW_MIN_INTERVAL_S)
        with self._lock:
            self.interval = interval
            previous = self._subscription
            if previous is not None and previous.active:
                # the new hold first: between the two the sampler's thread must not stop
                self._subscription = self.sampler.subscribe(_keep_sampling, interval=interval)
                previous.cancel()

    def stop(self) -> None:
        """Close the port (requests being answered finish) and cancel the subscription;
        harmless when stopped."""
        with self._lock:
            http, thread, subscription = self._http, self._thread, self._subscription
            self._thread = self._subscription = None
        if subscription is not None:
            subscription.cancel()
        if http is not None and thread is not None and thread.is_alive():
            http.shutdown()  # waits for the serving loop to end
            thread.join()
        if http is not None:
            http.server_close()
            http.end_connections()
        _listening.discard(self)

    def authorised(self, token: str | None) -> bool:
        """Whether ``token`` is this server's (compared in constant time)."""
        return token is not None and hmac.compare_digest(token.encode(), self.token.encode())

    def latest(self) -> Sample:
        """The sampler's newest reading; before its first, one taken on the caller's thread."""
        return self.sampler.latest() or self.sampler.sample_now()

    def reading(self) -> bytes:
        """The JSON of ``api/reading``: the newest reading, encoded once for every page."""
        sample, interval = self.latest(), self.interval
        encoded = self._reading
        if encoded is None or encoded[0] is not sample or encoded[1] != interval:
            body = json.dumps(route_bodies.reading(sample, interval)).encode()
            self._reading = encoded = (sample, interval, body)
        return encoded[2]

    def __repr__(self) -> str:
        where = f"port {self.port}" if self.running else "stopped"
        return f"<PageServer {where}, every {self.interval:g} s>"

    def _close_after_fork(self) -> None:
        """In a forked child (a data loader's worker): let go of the parent's socket, so
        that stopping the parent's server closes its port."""
        if self._http is not None:
            self._http.let_go()
        self._http = self._thread = self._subscription = None


def _keep_sampling(sample: Sample) -> None:
    """The page server's hold on the sampler: the routes read the readings kept."""


class _HttpServer(ConnectionsServer):
    """The page's HTTP server; its errors go to the log, never to stderr (a kernel's stderr
    is the notebook's output)."""

    page: PageServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("dashboard page request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests: for each, the token checked, then a route answered."""

    server: _HttpServer
    protocol_version = "HTTP/1.1"  # the connection stays open for the page's next poll
    disable_nagle_algorithm = True  # an answer leaves at once, not after the client's ACK
    wbufsize = io.DEFAULT_BUFFER_SIZE  # headers and body leave together, in one write
    timeout = REQUEST_TIMEOUT_S
    server_version = "ipycloud"
    sys_version = ""

    def do_HEAD(self) -> None:
        """As GET, without the body (``_answer`` leaves it out)."""
        self.do_GET()

    def do_GET(self) -> None:
        if self.server.ended:  # the server stopped while this request came in
            self.close_connection = True
            return
        url = urlsplit(self.path)
        query = {name: values[-1] for name, values in parse_qs(url.query).items()}
        page = self.server.page
        if not page.authorised(query.get("token") or _header_token(self.headers)):
            self._answer(_json(403, {"message": "the token is missing or not this "
                                                "dashboard's"}))
            return
        route = url.path
        if route.startswith(RUN_ROUTE):
            route, query["id"] = RUN_ROUTE, route.removeprefix(RUN_ROUTE)
        answer = _ROUTES.get(route)
        if answer is None:
            self._answer(_json(404, {"message": f"no route {url.path!r}"}))
            return
        try:
            self._answer(answer(page, query))
        except NoSuchRun as error:
            self._answer(_json(404, {"message": str(error)}))
        except ValueError as error:
            self._answer(_json(400, {"message": str(error)}))

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """The errors http.server finds itself (a malformed request, a method without a
        ``do_`` method here) as the API's JSON; a method other than GET and HEAD is a 405.
        The connection is closed after it: a request body may be left unread on it."""
        self.close_connection = True
        headers = {"Connection": "close"}
        if code == HTTPStatus.NOT_IMPLEMENTED:  # what http.server answers an unknown method
            code, headers["Allow"] = HTTPStatus.METHOD_NOT_ALLOWED, ALLOWED_METHODS
            message = (f"{self.command} is not allowed: the dashboard page answers "
                       f"{ALLOWED_METHODS}")
        self._answer(_json(code, {"message": message or HTTPStatus(code).phrase}), headers)

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: a kernel's stderr is the notebook's output."""

    def _answer(self, answer: Answer, headers: dict[str, str] | None = None) -> None:
        status, content_type, body = answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Referrer-Policy", "no-referrer")  # the address holds the token
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _header_token(headers: Any) -> str | None:
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "token" else None


def _json(status: int, body: object) -> Answer:
    return status, JSON, json.dumps(body).encode()


class MissingPage(FileNotFoundError):
    """This installation lacks the page's HTML."""


@functools.cache
def read_page() -> bytes:
    """The page's HTML, read once; MissingPage when it was not built."""
    folder, name = PAGE
    try:
        return resources.files("ipycloud").joinpath(folder).joinpath(name).read_bytes()
    except FileNotFoundError:
        raise MissingPage("This installation of ipycloud lacks its dashboard page "
                          "(ipycloud/monitor_page/index.html): install ipycloud again, or "
                          "build it in a checkout with 'jlpm build' in labextension/.") from None


def _page(page: PageServer, query: dict[str, str]) -> Answer:
    try:
        return 200, "text/html; charset=utf-8", read_page()
    except MissingPage as error:
        return 500, "text/plain; charset=utf-8", str(error).encode()


def _reading(page: PageServer, query: dict[str, str]) -> Answer:
    return 200, JSON, page.reading()


def _history(page: PageServer, query: dict[str, str]) -> Answer:
    since = route_bodies.parse_since(query.get("since"))
    body = route_bodies.history(page.sampler.history(since), page.interval)
    return 200, JSON, body.encode()


def _runs(page: PageServer, query: dict[str, str]) -> Answer:
    return 200, JSON, runs_answer()


def _run(page: PageServer, query: dict[str, str]) -> Answer:
    return 200, JSON, run_answer(query["id"], route_bodies.parse_since(query.get("since")))


RUN_ROUTE = "/api/runs/"  # followed by the run's id
_ROUTES: dict[str, Callable[[PageServer, dict[str, str]], Answer]] = {
    "/": _page,
    "/api/reading": _reading,
    "/api/history": _history,
    "/api/runs": _runs,
    RUN_ROUTE: _run,
}

# The servers listening in this process, let go of by a forked child.
_listening: weakref.WeakSet[PageServer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for server in list(_listening):
        server._close_after_fork()
    _listening.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Serving:
    """The page server of this process, if one runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.server: PageServer | None = None

    def stop(self) -> PageServer | None:
        with self.lock:
            server, self.server = self.server, None
        if server is not None:
            server.stop()
        return server


@per_process(close=_Serving.stop)
def _serving() -> _Serving:
    return _Serving()


def serve_page(interval: float = DEFAULT_INTERVAL_S) -> PageServer:
    """This process's dashboard page server on the shared sampler, started if none runs
    (else it follows ``interval`` from now on), with session monitoring started too (for
    ``usage_report()``). Its ``url()`` is the page's address on this machine."""
    from ipycloud.runtime.monitor.session import start_monitoring

    check_interval(interval, minimum=VIEW_MIN_INTERVAL_S)  # a mistake starts nothing
    serving = _serving()
    with serving.lock:
        start_monitoring()
        if serving.server is None or not serving.server.running:
            serving.server = PageServer(shared_sampler(), interval).start()
        else:
            serving.server.follow(interval)
        return serving.server


def stop_page() -> PageServer | None:
    """Stop this process's dashboard page server (its port closes); the one stopped, if any
    ran. Session monitoring goes on: ``stop_monitoring()`` ends it."""
    return _serving().stop()
