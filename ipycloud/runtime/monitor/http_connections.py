"""An HTTP server for many small answers to many clients, on threads that are reused.

Each connection is served on a daemon thread of its own, so a client that sends nothing
holds up no other; a thread that finished with its connection waits for the next one, so a
client that opens a connection per request does not pay for a thread start each time. The
server keeps track of its open connections: ``end_connections()`` ends them (its handler
answers no request while ``ended``), and a forked child lets go of its copies with
``let_go()``.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from http.server import HTTPServer
from typing import Any

IDLE_THREADS = 64  # threads kept waiting for connections after a burst of them
Connection = tuple[socket.socket, Any]  # a connection and its client's address


class ConnectionsServer(HTTPServer):
    """An HTTP server whose connections are served by reused daemon threads and ended on
    request. Connections opened while it cannot accept (its process busy) wait in a listen
    queue as long as the system allows, instead of being dropped."""

    request_queue_size = socket.SOMAXCONN  # the listen backlog (the system caps it)

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        super().__init__(address, handler)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.ended = False  # the connections were ended: a request read now gets no answer
        self._threads = _ReusedThreads(self._serve)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._open.add(request)
        self._threads.run((request, client_address))

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Close the port; the threads waiting for a connection end."""
        super().server_close()
        self._threads.close()

    def end_connections(self) -> None:
        """End each open connection once the answer under way on it (if any) is written: a
        client that kept its connection gets no more answers."""
        self.ended = True
        for connection in self._connections():
            with contextlib.suppress(OSError):  # already closed by its client
                connection.shutdown(socket.SHUT_RD)

    def let_go(self) -> None:
        """Close this process's descriptors of the port and of the connections, leaving them
        to another process that serves them (the parent of a forked child)."""
        self.socket.close()
        for connection in self._connections():
            connection.close()

    def _serve(self, connection: Connection) -> None:
        request, client_address = connection
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def _connections(self) -> list[socket.socket]:
        with self._lock:
            return list(self._open)


class _ReusedThreads:
    """Runs each job at once on a daemon thread: an idle one if any waits, else a new one.
    Up to IDLE_THREADS threads wait for the next job after theirs; ``close()`` ends them."""

    def __init__(self, work: Any) -> None:
        self._work = work
        self._jobs: queue.SimpleQueue[Connection | None] = queue.SimpleQueue()
        self._idle = 0  # threads waiting on the queue, each for one job
        self._closed = False
        self._lock = threading.Lock()

    def run(self, job: Connection) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put(job)
                return
        threading.Thread(target=self._loop, args=(job,), name="ipycloud-page-connection",
                         daemon=True).start()

    def close(self) -> None:
        """End the idle threads now and the busy ones after their job."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._jobs.put(None)

    def _loop(self, job: Connection | None) -> None:
        while job is not None:
            self._work(job)
            with self._lock:
                if self._closed or self._idle >= IDLE_THREADS:
                    return
                self._idle += 1
            job = self._jobs.get()
