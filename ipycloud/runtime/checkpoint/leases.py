"""Runs: which checkpoints in a folder one live writer owns.

Every checkpoint records the run it belongs to. A process that saves into a folder
continues the newest run there whose writer is gone (a restarted kernel goes on where it
stopped), or starts a run of its own when the newest belongs to a writer still alive (two
notebooks on one folder). Rotation removes only checkpoints of the writer's own run, and
"latest" and "best" never pick a checkpoint of a run another live process is writing.

A writer announces itself with a lease file in the folder, ``.ipycloud-run-<id>.json``:
process id, host, the process's start time and the notebook. A run is live elsewhere when
its lease names another process on this host that is still running (the start time tells
a reused process id apart; one that ended but is not reaped yet has ended). Writers on
other machines cannot be seen: their runs count as gone, so a run preempted on one
machine is resumed on the next.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.checkpoint.errors import CheckpointWarning
from ipycloud.runtime.durable import write_bytes_atomically
from ipycloud.runtime.per_process import per_process
from ipycloud.runtime.untrusted import is_count, is_unix_time, load_json, read_small
from ipycloud.runtime.user_warning import warn

LEASE_PREFIX = ".ipycloud-run-"
LEASE_SUFFIX = ".json"
MAX_LEASE_BYTES = 64 * 1024  # a longer lease is not one
_START_SLACK_S = 1.0  # process start times are compared to this precision


@dataclass(frozen=True)
class Writer:
    """The process that writes one run's checkpoints, as its lease describes it."""

    run: str
    pid: int
    host: str
    started: float  # the process's start, in Unix seconds
    notebook: str | None = None

    def describe(self) -> str:
        """``pid 4242, train.ipynb``."""
        return f"pid {self.pid}" + (f", {self.notebook}" if self.notebook else "")


def new_run_id() -> str:
    return secrets.token_hex(6)


def this_process(run: str) -> Writer:
    """This process as the writer of ``run``."""
    import psutil

    notebook = os.environ.get("JPY_SESSION_NAME") or None
    return Writer(run, os.getpid(), socket.gethostname(),
                  psutil.Process().create_time(), notebook and os.path.basename(notebook))


def live_elsewhere(folder: Path) -> dict[str, Writer]:
    """The runs in ``folder`` that another running process of this host writes, by id.

    An unreadable folder or lease counts as none.
    """
    live: dict[str, Writer] = {}
    try:
        leases = list(folder.glob(f"{LEASE_PREFIX}*{LEASE_SUFFIX}"))
    except OSError:
        return live
    for lease in leases:
        writer = _read_lease(lease)
        if writer is not None and _running_elsewhere(writer):
            live[writer.run] = writer
    return live


def _read_lease(path: Path) -> Writer | None:
    """The writer the lease at ``path`` names; None where it is no regular file of at most
    MAX_LEASE_BYTES or no lease."""
    try:
        return parse_lease(read_small(path, MAX_LEASE_BYTES), path.name)
    except (OSError, ValueError):
        return None


def parse_lease(data: bytes, name: str) -> Writer | None:
    """The writer the lease file ``name`` holding ``data`` names; None where it is not a
    lease (not JSON, fields missing or of other types, another run's file name)."""
    try:
        writer = Writer(**load_json(data))
    except (ValueError, TypeError):
        return None
    valid = (is_count(writer.pid) and writer.pid > 0 and isinstance(writer.host, str)
             and is_unix_time(writer.started) and isinstance(writer.run, str)
             and (writer.notebook is None or isinstance(writer.notebook, str))
             and name == f"{LEASE_PREFIX}{writer.run}{LEASE_SUFFIX}")
    return writer if valid else None


def _running_elsewhere(writer: Writer) -> bool:
    return writer.pid != os.getpid() and process_alive(writer.pid, writer.host, writer.started)


def process_alive(pid: int, host: str, started: float | None) -> bool:
    """Whether process ``pid`` of ``host`` that started at ``started`` (Unix seconds; None:
    not known) still runs. False for another host's (it cannot be seen from here), for a
    process that ended but is not reaped yet, and for a reused process id (another start
    time)."""
    import psutil

    if host != socket.gethostname():
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # ended, not reaped yet
            return False
        created = process.create_time()
    except psutil.Error:
        return False
    return started is None or abs(created - started) < _START_SLACK_S


@dataclass
class _Claim:
    run: str
    leased: bool = False  # whether this process's lease is written in the folder


@per_process()
def _claims() -> dict[str, _Claim]:
    """The run this process writes in each folder, by the folder's real path (a forked
    child is another process: it forgets them and claims runs of its own)."""
    return {}


def claimed(folder: Path) -> str | None:
    """The run this process writes in ``folder``, if it has claimed or adopted one."""
    found = _claims().get(os.path.realpath(folder))
    return None if found is None else found.run


def leased(folder: Path) -> bool:
    """Whether this process has saved into ``folder`` under its run (its lease written)."""
    found = _claims().get(os.path.realpath(folder))
    return found is not None and found.leased


def claim(folder: Path, infos: Sequence[CheckpointInfo]) -> str:
    """The run this process writes in ``folder`` (``infos``: its checkpoints, oldest
    first): the one it claimed or adopted, else the newest run whose writer is gone, else
    a new one.

    On the first save this process makes there, its lease is written (where the folder
    allows: a folder that refuses it still gets the run), and it is warned if another
    live process writes into the folder too.
    """
    key = os.path.realpath(folder)
    found = _claims().get(key)
    if found is not None and found.leased:
        return found.run
    others = live_elsewhere(folder)
    if found is None:
        run = next((info.run for info in reversed(infos)
                    if info.run is not None and info.run not in others), None)
        found = _claims().setdefault(key, _Claim(run or new_run_id()))  # first thread wins
    with contextlib.suppress(OSError):
        lease = folder / f"{LEASE_PREFIX}{found.run}{LEASE_SUFFIX}"
        write_bytes_atomically(lease, json.dumps(asdict(this_process(found.run))).encode())
    found.leased = True
    if others:
        names = ", ".join(writer.describe() for writer in others.values())
        warn(f"another live process ({names}) saves checkpoints into {folder} "
             "too: this process keeps its own beside them, neither removes the "
             "other's, and 'latest' here means this process's newest; give each "
             "notebook a folder of its own", CheckpointWarning)
    return found.run


def adopt(folder: Path, run: str | None) -> None:
    """After loading a checkpoint of ``run``: this process goes on with that run, unless
    it writes one in ``folder`` already."""
    if run is not None:
        _claims().setdefault(os.path.realpath(folder), _Claim(run))
