"""The dashboard page a kernel serves itself: its token, its JSON from the shared sampler on
a fake NVML board, its connections (many opened at once, kept between polls, ended by stop),
its port closed by stop, reset and in forked children, and ``%dashboard`` showing it
(``--web`` anywhere, plain ``%dashboard`` on Colab through the google.colab stub)."""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from api_schema import check_route
from IPython.core.error import UsageError
from jupyter_process import refused
from page_process import PageProcess
from waiting import wait_for

from ipycloud.magics.dashboard_web import PageView, page_height
from ipycloud.runtime.monitor.sampler import shared_sampler
from ipycloud.runtime.monitor.webpage import (
    REQUEST_TIMEOUT_S,
    PageServer,
    serve_page,
    stop_page,
)
from ipycloud.runtime.per_process import reset_process_state

MIB = 2**20
JSON_TYPE = "application/json"
READING_KEYS = {"time", "interval_s", "platform", "gpu_problem", "gpus", "cpu", "ram", "disks",
                "network", "disk_io"}


def get(server: PageServer | int, path: str, headers: dict[str, str] | None = None
        ) -> tuple[int, str, bytes]:
    """Status, content type and body of a GET on the server's port."""
    port = server if isinstance(server, int) else server.port
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def get_json(server: PageServer, route: str, **query: object) -> Any:
    """The JSON of an authorised GET of ``api/<route>``; the test fails on another status."""
    search = "&".join(f"{name}={value}" for name, value in {"token": server.token,
                                                             **query}.items())
    status, content_type, body = get(server, f"/api/{route}?{search}")
    assert (status, content_type) == (200, "application/json"), body
    return check_route(route, json.loads(body))


@pytest.fixture
def colab_output(monkeypatch: pytest.MonkeyPatch, colab_stub: None) -> Iterator[Any]:
    """A Colab kernel: its marker variable set, the google.colab stub importable and reset."""
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261120-060000_RC00")
    from google.colab import output

    output.calls.clear()
    yield output


@pytest.fixture
def web_shell(shell: Any, board: Any, local_home: Path) -> Iterator[Any]:
    """The shell fixture on a local machine with one T4; its dashboards stopped after."""
    board("1xT4")
    yield shell
    shell.run_line_magic("dashboard", "stop")


@pytest.mark.parametrize("path", ["/", "/api/reading", "/api/history", "/api/history?since=0",
                                  "/nowhere"])
def test_a_request_without_the_token_is_refused(page_server: PageServer, path: str) -> None:
    token = page_server.token
    wrong = token[:-1] + ("A" if token[-1] != "A" else "B")  # as long, one character off
    separator = "&" if "?" in path else "?"
    for attempt, headers in [(path, {}),
                             (f"{path}{separator}token={wrong}", {}),
                             (f"{path}{separator}token=", {}),
                             (path, {"Authorization": f"token {wrong}"}),
                             (path, {"Authorization": f"Bearer {token}"})]:
        status, content_type, body = get(page_server, attempt, headers)
        assert (status, content_type) == (403, "application/json"), attempt
        assert json.loads(body) == {"message": "the token is missing or not this dashboard's"}
    assert get(page_server, "/api/reading", {"Authorization": f"token {token}"})[0] == 200


def request(server: PageServer, method: str, path: str) -> http.client.HTTPResponse:
    """The answer to one request (its body read) on a connection of its own."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.request(method, path, body=b'{"x": 1}' if method in {"POST", "PUT"} else None)
    response = connection.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    connection.close()
    return response


@pytest.mark.parametrize("path", ["/", "/api/history?since=1e12"])
def test_head_is_answered_as_get_without_a_body(page_server: PageServer, path: str) -> None:
    authorised = f"{path}{'&' if '?' in path else '?'}token={page_server.token}"
    connection = http.client.HTTPConnection("127.0.0.1", page_server.port, timeout=10)
    connection.request("HEAD", authorised)
    head = connection.getresponse()
    head.read()  # nothing, whatever the server sent
    connection.request("GET", authorised)  # on the same connection: no body was left on it
    got = connection.getresponse()
    body = got.read()
    connection.close()
    assert (head.status, got.status) == (200, 200)
    assert head.getheader("Content-Type") == got.getheader("Content-Type")
    assert int(head.getheader("Content-Length") or -1) == len(body)
    refused = request(page_server, "HEAD", path)
    assert (refused.status, refused.body) == (403, b"")  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"])
def test_other_methods_are_a_json_405_with_allow(page_server: PageServer, method: str) -> None:
    answer = request(page_server, method, f"/api/reading?token={page_server.token}")
    assert (answer.status, answer.getheader("Allow")) == (405, "GET, HEAD")
    assert answer.getheader("Content-Type") == "application/json"
    assert json.loads(answer.body) == {  # type: ignore[attr-defined]
        "message": f"{method} is not allowed: the dashboard page answers GET, HEAD"}


def test_a_malformed_request_is_answered_in_json(page_server: PageServer) -> None:
    with socket.create_connection(("127.0.0.1", page_server.port), timeout=10) as client:
        client.sendall(b"GET / HTTP/1.1 HTTP/1.1\r\n\r\n")  # one word too many
        response = http.client.HTTPResponse(client)
        response.begin()
        assert response.status == 400 and response.getheader("Content-Type") == JSON_TYPE
        assert json.loads(response.read())["message"].startswith("Bad request syntax")


def test_reading_and_history_come_from_the_shared_sampler(board: Any, local_home: Path) -> None:
    board("1xT4")
    server = serve_page(interval=0.1)
    assert shared_sampler().running and shared_sampler().interval == 0.1
    wait_for(lambda: len(shared_sampler().history()) >= 3, what="three readings")
    reading = get_json(server, "reading")
    assert set(reading) == READING_KEYS
    assert reading["interval_s"] == 0.1
    assert reading["gpus"] == [{
        "index": 0, "name": "Tesla T4", "uuid": None, "utilization_percent": 0.0,
        "memory_used": 3 * MIB, "memory_total": 15360 * MIB, "temperature_c": 43.0,
        "power_w": 9.321, "power_limit_w": 70.0, "mig": []}]
    # the platform as the server names it; a kernel's own sampler reads no session time,
    # core count, throttling, RAM peak, or the Jupyter server's memory
    assert reading["platform"] == {"name": "Local machine", "session_left_s": None}
    assert reading["cpu"]["cores"] is None and reading["cpu"]["throttled_percent"] is None
    assert 0.0 <= reading["cpu"]["percent"] <= 100.0
    assert reading["ram"]["peak"] is None and 0 < reading["ram"]["used"] <= reading["ram"]["limit"]
    assert reading["ram"]["server_rss"] is None and reading["ram"]["kernels_rss"] is None
    assert reading["disks"][0]["roles"][0] == "working"

    everything = get_json(server, "history")
    assert everything["interval_s"] == 0.1
    times = [sample["time"] for sample in everything["samples"]]
    assert len(times) >= 3 and times == sorted(times)
    assert reading["time"] in times  # the newest reading is one the sampler kept
    later = get_json(server, "history", since=times[1])["samples"]
    assert [sample["time"] for sample in later][:len(times) - 2] == times[2:]
    assert later[0] == everything["samples"][2]
    status, _, body = get(server, f"/api/history?since=nan&token={server.token}")
    assert status == 400
    assert json.loads(body) == {
        "message": "since must be a finite number (a Unix time in seconds), not 'nan'"}


def test_the_port_closes_on_stop_and_on_reset(local_home: Path) -> None:
    server = serve_page(interval=0.2)
    assert serve_page(interval=0.5) is server  # one per process: it follows the new pace
    assert server.interval == 0.5 and shared_sampler().interval == 0.5
    assert get_json(server, "reading")["interval_s"] == 0.5
    port = server.port
    assert stop_page() is server and not server.running and refused(port)
    assert stop_page() is None

    again, sampler = serve_page(), shared_sampler()
    assert again is not server and again.token != server.token
    assert get(again, f"/?token={server.token}")[0] == 403  # an old page's token
    reset_process_state()
    assert refused(again.port) and not again.running and not sampler.running


def test_a_client_that_sends_nothing_holds_up_no_other(page_server: PageServer) -> None:
    with socket.create_connection(("127.0.0.1", page_server.port)):  # silent
        started = time.monotonic()
        get_json(page_server, "reading")
        assert time.monotonic() - started < 2


BURST = 64  # connections that pages opening at once start together


def test_connections_opened_while_the_server_cannot_accept_are_all_answered() -> None:
    """A kernel busy in C code that holds the interpreter accepts nothing for a while: the
    connections opened meanwhile wait to be accepted, none is dropped."""
    with PageProcess() as page:
        page.pause()
        clients = [socket.socket() for _ in range(BURST)]
        try:
            for client in clients:
                client.setblocking(False)
                client.connect_ex(("127.0.0.1", page.port))
            established = connected(clients)
            page.resume()
            assert len(established) == BURST, (f"{len(established)} of {BURST} connections "
                                               "established while the server was paused")
            for client in clients:
                client.settimeout(10)
                client.sendall(f"GET /api/reading?token={page.token} HTTP/1.1\r\n"
                               "Host: 127.0.0.1\r\n\r\n".encode())
            assert [status_of(client) for client in clients] == [200] * BURST
        finally:
            for client in clients:
                client.close()


def connected(clients: list[socket.socket], timeout: float = 10.0) -> list[socket.socket]:
    """The clients whose connection is established (in progress ones waited for up to
    ``timeout`` seconds in all)."""
    deadline = time.monotonic() + timeout
    pending, done = list(clients), []
    while pending and (left := deadline - time.monotonic()) > 0:
        _, writable, _ = select.select([], pending, [], left)
        for client in writable:
            pending.remove(client)
            assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            done.append(client)
    return done


def status_of(client: socket.socket) -> int:
    """The status of the answer read from ``client``, its body read too."""
    response = http.client.HTTPResponse(client)
    response.begin()
    response.read()
    return response.status


def test_a_page_asks_again_on_the_connection_it_opened(page_server: PageServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", page_server.port, timeout=10)
    path = f"/api/reading?token={page_server.token}"
    statuses, sockets = [], []
    for _ in range(3):
        connection.request("GET", path)
        response = connection.getresponse()
        json.loads(response.read())
        statuses.append(response.status)
        sockets.append(connection.sock)
    connection.close()
    assert statuses == [200] * 3
    assert sockets[0] is not None and sockets == [sockets[0]] * 3  # one connection


def test_stop_ends_the_connections_pages_keep(page_server: PageServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", page_server.port, timeout=10)
    path = f"/api/reading?token={page_server.token}"
    connection.request("GET", path)
    assert connection.getresponse().read()
    page_server.stop()
    with pytest.raises(ConnectionError):  # no answer on the kept connection
        connection.request("GET", path)
        connection.getresponse()
    connection.close()


def test_stop_leaves_no_thread_behind(page_server: PageServer) -> None:
    for _ in range(3):
        get_json(page_server, "reading")  # urllib: a connection for each request
    kept = http.client.HTTPConnection("127.0.0.1", page_server.port, timeout=10)
    kept.request("GET", f"/api/reading?token={page_server.token}")
    assert kept.getresponse().read()
    page_server.stop()
    wait_for(lambda: not [thread for thread in threading.enumerate()
                          if thread.name.startswith("ipycloud-page")],
             timeout=REQUEST_TIMEOUT_S / 2,  # sooner than an idle connection's own end
             what="the page server's threads to end")
    kept.close()


def test_each_new_reading_and_pace_is_answered(page_server: PageServer) -> None:
    first = get_json(page_server, "reading")
    wait_for(lambda: get_json(page_server, "reading")["time"] > first["time"],
             what="a newer reading")
    page_server.follow(0.5)
    assert get_json(page_server, "reading")["interval_s"] == 0.5


def test_a_forked_child_lets_go_of_the_port(page_server: PageServer) -> None:
    """A data loader's worker forked while the page is served must not keep its port open."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        child = os.fork()
    if child == 0:  # the child: wait until the parent has looked, then leave at once
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        port = page_server.port
        page_server.stop()
        assert refused(port)
    finally:
        os.write(write, b"x")
        os.close(write)
        os.waitpid(child, 0)


def test_the_page_is_one_file_with_everything_inline(page_server: PageServer) -> None:
    status, content_type, body = get(page_server, page_server.path(history=60))
    assert (status, content_type) == (200, "text/html; charset=utf-8")
    page = body.decode()
    assert page.startswith("<!doctype html>") and "<script>" in page and "<style>" in page
    assert " src=" not in page and "<link" not in page and "@import" not in page  # no CDN
    assert "ipycloud-Sparkline" in page  # the lab extension's sparklines, bundled


def test_dashboard_web_shows_the_page_in_an_iframe(web_shell: Any) -> None:
    view = web_shell.run_line_magic("dashboard", "--web --interval 0.2 --history 30s")
    assert isinstance(view, PageView) and view.height == page_height(1)
    url = urlsplit(view.url)
    query = parse_qs(url.query)
    assert (url.scheme, url.hostname, url.path) == ("http", "127.0.0.1", "/")
    assert query["history"] == ["30"]
    html = view._repr_html_()
    assert f'<iframe src="{view.url.replace("&", "&amp;")}"' in html
    assert f'height="{view.height}"' in html
    assert repr(view) == f"ipycloud dashboard page: {view.url} (%dashboard stop closes it)"
    status, _, body = get(url.port or 0, f"/api/reading?token={query['token'][0]}")
    assert status == 200 and json.loads(body)["gpus"][0]["name"] == "Tesla T4"

    notice = str(web_shell.run_line_magic("dashboard", "stop"))
    assert notice == (f"stopped 0 dashboards and the dashboard page (port {url.port} "
                      "closed); the background sampler has stopped")
    assert refused(url.port or 0)


def test_on_colab_plain_dashboard_serves_the_port_through_colab(
        web_shell: Any, colab_output: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # the page needs no widgets
    assert web_shell.run_line_magic("dashboard", "--interval 0.5") is None  # Colab showed it
    (call,) = colab_output.calls
    path = urlsplit(call["path"])
    token = parse_qs(path.query)["token"][0]
    assert call == {"port": call["port"], "path": call["path"], "width": "100%",
                    "height": str(page_height(1)), "cache_in_notebook": False}
    assert path.path == "/" and parse_qs(path.query)["history"] == ["300"]
    assert get(call["port"], call["path"])[0] == 200  # the path's token opens the page
    assert get(call["port"], f"/api/reading?token={token}")[0] == 200
    assert get(call["port"], "/")[0] == 403

    web_shell.run_line_magic("dashboard", "--web")  # on Colab too, Colab's iframe
    assert [each["port"] for each in colab_output.calls] == [call["port"]] * 2  # one server
    web_shell.run_line_magic("dashboard", "stop")
    assert refused(call["port"])


def test_the_page_height_grows_with_the_gpus() -> None:
    heights = [page_height(gpus) for gpus in (0, 1, 2, 8)]
    assert heights[0] == heights[1] < heights[2] < heights[3]


@pytest.mark.parametrize(("line", "message"), [
    ("--web --text", "%dashboard: --web and --text do not go together: pick one"),
    ("--web --interval 0.01", "interval must be a number of seconds from 0.1 to 3600"),
    ("--web --history 1", "the history must be longer than the interval (1 s)"),
    ("stop --web", "%dashboard: --web does not apply to stop"),
])
def test_wrong_web_lines_start_nothing(web_shell: Any, line: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        web_shell.run_line_magic("dashboard", line)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert stop_page() is None and not shared_sampler().running

