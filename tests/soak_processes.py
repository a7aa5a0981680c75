"""Processes for the soaks: victims forked from this process, killed at chosen moments, and
whatever they leave running.

A victim runs a function in a forked child, in a process group of its own, and reports
what it does (one JSON object a line) through a pipe; it may also wait for commands. A
line written before a SIGKILL is still read afterwards, so "the last step it reported
as saved" is exact. Its output goes to a log file of its own; a victim that hangs is
asked for the stacks of its threads (``faulthandler`` on SIGUSR1), which go there too.

This process becomes a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): the processes
a killed victim leaves (its checkpoint writer process, DataLoader workers, ``launch``
ranks) become children of this one, as they would of init, so ``Strays`` can watch them
end. They are reaped late, as an init that reaps late (or a container without one) does:
only once what follows a kill (the next save, a resumed run) is done, so that it meets
the dead processes as zombies.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import select
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from process_helpers import ended

PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """Make this process the one that inherits its descendants' orphans, for a while."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        reap_zombies()


_victims: set[int] = set()  # the victims that have not been reaped: each reaps its own


def reap_zombies() -> None:
    """Reap this process's children that have exited, victims aside (each is reaped by
    its Victim, which needs its status)."""
    for child in psutil.Process().children():
        if child.pid not in _victims:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(child.pid, os.WNOHANG)


class Channel:
    """The victim's side: report events, read commands."""

    def __init__(self, report_fd: int, command_fd: int) -> None:
        self._report_fd = report_fd
        self._commands = os.fdopen(command_fd, "r")

    def report(self, event: str, **fields: Any) -> None:
        """One line, written at once (lines under PIPE_BUF arrive whole)."""
        os.write(self._report_fd, (json.dumps({"event": event, **fields}) + "\n").encode())

    def command(self) -> str:
        """The next command line (empty once the driver is gone)."""
        return self._commands.readline().strip()


Event = dict[str, Any]


class Victim:
    """A forked child that runs ``body(channel)`` and then exits (status 0, or 1 after
    reporting an "error" event); its output goes to ``<logs>/<pid>.log``."""

    def __init__(self, body: Callable[[Channel], object], label: str, logs: Path) -> None:
        self.label = label
        logs.mkdir(parents=True, exist_ok=True)
        report_read, report_write = os.pipe()
        command_read, command_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            os.close(report_read)
            os.close(command_write)
            _run_victim(body, Channel(report_write, command_read), logs)
        os.close(report_write)
        os.close(command_read)
        self.pid = pid
        self.log = logs / f"{pid}.log"
        _victims.add(pid)
        self.process = psutil.Process(pid)
        self.events: list[Event] = []
        self.status: int | None = None  # waitpid status once it has ended
        self._reports = report_read
        self._commands = command_write
        self._buffer = b""

    def send(self, command: str) -> None:
        os.write(self._commands, f"{command}\n".encode())

    def next_event(self, timeout: float) -> Event | None:
        """The next event it reported, waiting up to ``timeout`` s; None if none came (it
        may have ended: see ``ended``)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._reports], [], [], left)[0]:
                return None
            chunk = os.read(self._reports, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        event: Event = json.loads(line)
        self.events.append(event)
        if event["event"] == "error":
            raise VictimError(f"{self.label} failed:\n{event['traceback']}")
        return event

    def wait_for(self, accept: Callable[[Event], bool], timeout: float,
                 what: str) -> Event:
        """Read events until one is accepted; VictimHang if none comes in ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.next_event(max(0.0, deadline - time.monotonic()))
            if event is None:
                if self.ended():
                    raise VictimEnded(f"{self.label} ended ({self.describe_status()}) "
                                      f"before {what}")
                raise VictimHang(f"{self.label} reported nothing for {timeout:.0f} s while "
                                 f"waiting for {what} (last: {self.last_event()}); its "
                                 f"threads:\n{self.stacks()}")
            if accept(event):
                return event

    def stacks(self) -> str:
        """The stacks of its threads, as faulthandler writes them to its log."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR1)
            time.sleep(1.0)
        with contextlib.suppress(OSError):
            return self.log.read_text()[-20000:]
        return "(no log)"

    def drain(self) -> list[Event]:
        """The events still in the pipe (after its death: everything it wrote)."""
        drained = []
        while (event := self.next_event(0.0)) is not None:
            drained.append(event)
        return drained

    def descendants(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return self.process.children(recursive=True)
        return []

    def started(self) -> list[Started]:
        """The processes it has started (and they started), as they are now."""
        found = []
        for process in self.descendants():
            with contextlib.suppress(psutil.Error):
                found.append(Started(process, process.ppid(), process.cmdline()))
        return found

    def kill(self) -> list[Started]:
        """SIGKILL it alone (not its group) and reap it; returns what it had started."""
        left = self.started()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.join()
        return left

    def kill_group(self) -> None:
        """SIGKILL its whole process group (a watchdog's last resort) and reap it."""
        for process in self.descendants():
            with contextlib.suppress(psutil.Error):
                process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.join()

    def ended(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
                _victims.discard(self.pid)
        return self.status is not None

    def join(self, timeout: float | None = None) -> bool:
        """Wait for it to end (reaping it); False if it still runs after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ended():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def exit_within(self, timeout: float) -> None:
        """Wait for it to exit, its work done; VictimHang, with its threads' stacks, if it
        still runs after ``timeout`` s."""
        if not self.join(timeout):
            raise VictimHang(f"{self.label} did not exit after its work ({timeout:.0f} s); "
                             f"its threads:\n{self.stacks()}")

    def describe_status(self) -> str:
        if self.status is None:
            return "running"
        if os.WIFSIGNALED(self.status):
            return f"killed by {signal.Signals(os.WTERMSIG(self.status)).name}"
        return f"exit status {os.WEXITSTATUS(self.status)}"

    def last_event(self) -> Event | None:
        return self.events[-1] if self.events else None

    def close(self) -> None:
        if not self.ended():
            self.kill_group()
        os.close(self._reports)
        os.close(self._commands)


def _run_victim(body: Callable[[Channel], object], channel: Channel, logs: Path) -> None:
    """The child's whole life: never returns into the parent's code."""
    code = 1
    try:
        os.setpgid(0, 0)
        log = os.open(logs / f"{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        import torch

        torch.set_num_threads(1)  # OpenMP's thread pool does not survive fork
        body(channel)
        code = 0
    except BaseException as error:  # reported whole; the driver raises it
        with contextlib.suppress(BaseException):
            channel.report("error", traceback="".join(
                traceback.format_exception(type(error), error, error.__traceback__)))
    finally:
        os._exit(code)


class VictimError(AssertionError):
    """A victim raised: its traceback."""


class VictimHang(AssertionError):
    """A victim reported nothing for longer than its watchdog allows."""


class VictimEnded(AssertionError):
    """A victim ended before it reported what was waited for."""


@dataclass(frozen=True)
class Started:
    """A process a victim started, with its parent and command line when it was seen."""

    process: psutil.Process
    parent: int
    cmdline: list[str]

    def role(self, victim: int, launches: bool) -> str:
        if any("writer_child" in part for part in self.cmdline):
            return "writer process"
        return "rank" if launches and self.parent == victim else "worker"


@dataclass
class Stray:
    """A process a killed victim had started, and how long it outlived the victim."""

    pid: int
    role: str
    process: psutil.Process
    killed_at: float
    deadline_s: float
    gone_after_s: float | None = None


# How long each process a victim started may outlive it: each watches its parent's pidfd.
DEADLINES_S = {"writer process": 5.0, "rank": 10.0, "worker": 10.0}


@dataclass
class Strays:
    """The processes killed victims leave, watched until they end or their deadline passes.

    Roles: "writer process" (the checkpoint writer), "rank" (a ``launch`` rank: a child of a
    victim that launches) and "worker" (anything else, DataLoader workers).
    """

    deadlines_s: dict[str, float] = field(default_factory=lambda: dict(DEADLINES_S))
    watched: list[Stray] = field(default_factory=list)

    def add(self, victim: Victim, left: list[Started], launches: bool) -> list[Stray]:
        """Watch what ``victim`` (just killed) had started; also every orphan that reached
        this process, whatever it was."""
        now = time.monotonic()
        added = []
        seen = {stray.pid for stray in self.watched}
        candidates = {started.process.pid: started for started in left}
        for child in psutil.Process().children():
            if child.pid not in _victims:
                with contextlib.suppress(psutil.Error):
                    candidates.setdefault(child.pid, Started(child, -1, child.cmdline()))
        for pid, started in candidates.items():
            if pid in seen:
                continue
            role = started.role(victim.pid, launches)
            stray = Stray(pid, role, started.process, now, self.deadlines_s[role])
            if ended(started.process):  # ended with the victim already
                stray.gone_after_s = 0.0
            self.watched.append(stray)
            added.append(stray)
        return added

    def poll(self) -> None:
        """Note which have ended (they stay zombies until ``finish``)."""
        now = time.monotonic()
        for stray in self.watched:
            if stray.gone_after_s is None and ended(stray.process):
                stray.gone_after_s = now - stray.killed_at

    def wait(self, strays: list[Stray]) -> None:
        """Wait until each of ``strays`` has ended or passed its deadline."""
        while True:
            self.poll()
            now = time.monotonic()
            if all(stray.gone_after_s is not None or now - stray.killed_at > stray.deadline_s
                   for stray in strays):
                return
            time.sleep(0.02)

    def left_behind(self, strays: list[Stray] | None = None) -> list[Stray]:
        """Those still running past their deadline (killed here, so they end at last)."""
        self.poll()
        now = time.monotonic()
        late = [stray for stray in (self.watched if strays is None else strays)
                if (stray.gone_after_s if stray.gone_after_s is not None
                    else now - stray.killed_at) > stray.deadline_s]
        for stray in late:
            if stray.gone_after_s is None:
                with contextlib.suppress(psutil.Error):
                    stray.process.kill()
        return late

    def finish(self) -> None:
        """Wait for every stray to end or pass its deadline; reap them."""
        self.wait(self.watched)
        reap_zombies()
