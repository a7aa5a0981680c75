"""The checkpoint writer process's side: map the shared region, write what is asked.

Started by ``writer_process.WriterProcess`` as ``python -c ... main(FD, PARENT)``. Each
request is a target path and a pickled state whose tensors refer into the shared region;
the state is written to a durable temporary file beside the target, which only the
parent renames into place (under its lock on the folder), so a writer can never commit
what its parent no longer owns. Each reply says what happened: ("ok", temporary path,
size, crc32), ("oserror", errno, strerror) or ("error", text). The process exits when its
socket reaches its end, and ends as soon as its parent dies.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import socket
from pathlib import Path
from typing import Any

from ipycloud.runtime.checkpoint import shared_buffers
from ipycloud.runtime.checkpoint.data_file import write_data_temporary
from ipycloud.runtime.checkpoint.writer_process import receive_message, send_message
from ipycloud.runtime.lifetime import end_with


def main(fd: int, parent: int) -> None:
    """Serve write requests on the socket ``fd`` until it closes or ``parent`` dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    end_with(parent)
    region: mmap.mmap | None = None
    with socket.socket(fileno=fd) as sock:
        while (message := _next_request(sock)) is not None:
            body, fds = message
            if fds:
                region = _map(fds)
            send_message(sock, pickle.dumps(_write(body, region)))


def _next_request(sock: socket.socket) -> tuple[bytes, list[int]] | None:
    """The next request, or None at the end: the parent closed the socket, or died while
    sending (the end of a request cut short is read before the death is seen)."""
    try:
        return receive_message(sock)
    except (EOFError, ConnectionError):
        return None


def _map(fds: list[int]) -> mmap.mmap:
    """Map the newest region received; close every descriptor."""
    try:
        return mmap.mmap(fds[-1], os.fstat(fds[-1]).st_size)
    finally:
        for fd in fds:
            os.close(fd)


def _write(body: bytes, region: mmap.mmap | None) -> tuple[Any, ...]:
    path, state = pickle.loads(body)
    try:
        temporary, digest = write_data_temporary(Path(path),
                                                 shared_buffers.loads(state, region))
    except OSError as error:
        return ("oserror", error.errno, error.strerror or str(error))
    except Exception as error:
        return ("error", f"{type(error).__name__}: {error}")
    return ("ok", str(temporary), digest.size, digest.crc32)
