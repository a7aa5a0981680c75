"""A child process that writes checkpoint data files from shared host buffers.

A thread writing a checkpoint competes with the training loop for the GIL: torch.save's
pickling and its writes through a Python file object hold it, and every time the loop's
thread lets go of it for a torch operation, it may have to wait to get it back. The writer
process has an interpreter of its own, so the loop pays for the copy into shared memory
and little else. It starts at the first background save (its import of torch, about a
second, runs beside the loop), writes at idle CPU priority until someone waits for it,
ignores interrupts (Jupyter's Stop signals the kernel's whole process group) and ends when
this process closes its socket or dies. The child writes a durable temporary file; this
process renames it into place, so nothing the child writes is committed unless this process
is alive to commit it. The request and reply cross a socket pair, framed by a length; the
region's descriptor travels with a request as ancillary data.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

from ipycloud.runtime.checkpoint import shared_buffers
from ipycloud.runtime.checkpoint.background import set_idle
from ipycloud.runtime.checkpoint.data_file import write_data_file
from ipycloud.runtime.checkpoint.errors import CheckpointError, CheckpointStorageError
from ipycloud.runtime.checkpoint.shared_buffers import SharedHostBuffers
from ipycloud.runtime.durable import FileDigest, commit_temporary

_HEADER = struct.Struct("<Q")  # the length of the pickled message that follows
_CHILD_CODE = ("import sys; from ipycloud.runtime.checkpoint.writer_child import main; "
               "main(int(sys.argv[1]), int(sys.argv[2]))")


def supported() -> bool:
    """Whether this system can share memory and pass descriptors with a child (Linux)."""
    return shared_buffers.supported() and hasattr(socket, "send_fds")


class WriterProcess:
    """Stages a state in shared memory and has a child process write it to a file."""

    def __init__(self) -> None:
        self._buffers = SharedHostBuffers()
        self._owner = os.getpid()
        self._lock = threading.Lock()  # one request at a time on the socket
        self._priority_lock = threading.Lock()
        self._hurried = False  # someone waits for the current save
        self._child: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._child_generation = 0  # the region the child has mapped
        self._finalizer: weakref.finalize[Any, WriterProcess] | None = None

    def __repr__(self) -> str:
        child = "not started" if self._child is None else f"pid {self._child.pid}"
        return f"WriterProcess({child})"

    @property
    def pid(self) -> int | None:
        """The child's PID, or None before the first write."""
        return None if self._child is None else self._child.pid

    def owned_here(self) -> bool:
        """False in a process forked from the one that made this object."""
        return self._owner == os.getpid()

    def stage(self, payload: Any) -> Any:
        """A copy of ``payload`` whose tensors are in shared memory (the caller's cost).

        The child is started here, in the caller's thread, unless it runs already. Started
        by the thread that writes, it could be started while the caller forks (a
        DataLoader worker, as an epoch begins): the forked process would hold the pipe
        through which subprocess learns that the child has started, and the start, the
        save and the caller waiting for it would wait for that process to end.
        """
        with self._priority_lock:
            self._hurried = False  # a new save: written at idle priority until waited for
        with self._lock:
            if not self._running():
                self._forget_child()
                with contextlib.suppress(OSError):  # no interpreter: ``write`` writes it
                    self._start_child()
        return self._buffers.copy(payload)

    def write(self, path: Path, staged: Any) -> FileDigest:
        """Have the child write ``staged`` (a result of ``stage``) to ``path`` atomically:
        the child writes a temporary file, renamed into place here.

        Where no child runs (none could be started: no interpreter at ``sys.executable``,
        as in some embedded Pythons; or it died since ``stage``), the calling thread writes
        it. Raises the child's OSError, or CheckpointError if the child failed or died.
        """
        request = pickle.dumps((str(path), self._buffers.dumps(staged)))
        with self._lock:
            if not self._running():
                return write_data_file(path, staged)
            child, sock = self._child, self._socket
            assert child is not None and sock is not None
            with self._priority_lock:
                set_idle(child.pid, not self._hurried)
            new_region = self._child_generation != self._buffers.generation
            try:
                send_message(sock, request, [self._buffers.fd] if new_region else [])
                self._child_generation = self._buffers.generation
                reply = receive_message(sock)
            except (OSError, EOFError):
                reply = None
            if reply is None:
                self._forget_child()
                raise CheckpointStorageError(f"the checkpoint writer process (pid {child.pid}) "
                                      f"{_exit_description(child)} before {path.name} "
                                      "was written")
        temporary, digest = _outcome(pickle.loads(reply[0]), path)
        commit_temporary(temporary, path)
        return digest

    def hurry(self) -> None:
        """Give the child normal CPU priority: someone is waiting for its write."""
        with self._priority_lock:
            self._hurried = True
            if self._child is not None:
                set_idle(self._child.pid, False)

    def close(self) -> None:
        """End the child (it exits when its socket closes) and free the region."""
        self._forget_child()
        self._buffers.close()

    def _running(self) -> bool:
        return (self._child is not None and self._socket is not None
                and self._child.poll() is None)

    def _start_child(self) -> None:
        ours, theirs = socket.socketpair()
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
        try:
            with theirs:
                self._child = subprocess.Popen(
                    [sys.executable, "-c", _CHILD_CODE, str(theirs.fileno()),
                     str(os.getpid())],
                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, env=environment, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        self._socket, self._child_generation = ours, 0
        self._finalizer = weakref.finalize(self, _end_child, ours, self._child, self._owner)
        self._finalizer.atexit = False  # exit waits for writes first (CheckpointManager)

    def _forget_child(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._child, self._socket, self._finalizer = None, None, None


def _end_child(sock: socket.socket, child: subprocess.Popen[bytes], owner: int) -> None:
    """End the child's socket and reap it: it exits when it reads the end.

    The socket is shut down, not only closed, so that the child reads the end even while
    a process forked from this one holds a copy of it. A forked copy of the owner only
    closes its own copy.
    """
    if os.getpid() != owner:
        sock.close()
        return
    set_idle(child.pid, False)  # its exit must not wait for idle CPU time
    with contextlib.suppress(OSError):  # the child may have gone already
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    try:
        child.wait(timeout=2)
    except subprocess.TimeoutExpired:
        child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # else reaped by subprocess
            child.wait(timeout=2)


def send_message(sock: socket.socket, body: bytes, fds: list[int | None] | None = None) -> None:
    """Send ``body`` framed by its length, with ``fds`` passed along with the header."""
    descriptors = [fd for fd in fds or [] if fd is not None]
    socket.send_fds(sock, [_HEADER.pack(len(body))], descriptors)
    sock.sendall(body)


def receive_message(sock: socket.socket) -> tuple[bytes, list[int]] | None:
    """The next message and the descriptors that came with it; None at the end."""
    header, fds, _flags, _address = socket.recv_fds(sock, _HEADER.size, 1)
    if not header:
        return None
    header += _receive_exactly(sock, _HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    return _receive_exactly(sock, size), fds


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    received = bytearray()
    while len(received) < size:
        chunk = sock.recv(min(size - len(received), 1 << 20))
        if not chunk:
            raise EOFError("the other end closed mid-message")
        received += chunk
    return bytes(received)


def _outcome(reply: tuple[Any, ...], path: Path) -> tuple[Path, FileDigest]:
    """The temporary file and its digest from the child's reply: ("ok", temporary, size,
    crc32), ("oserror", errno, strerror) or ("error", text)."""
    if reply[0] == "ok":
        return Path(reply[1]), FileDigest(reply[2], reply[3])
    if reply[0] == "oserror":
        raise OSError(reply[1], reply[2], str(path))
    raise CheckpointError(f"the checkpoint writer process could not write {path.name}: "
                          f"{reply[1]}")


def _exit_description(child: subprocess.Popen[bytes]) -> str:
    code = child.poll()
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"
