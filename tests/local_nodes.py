"""Two torchrun agents on this machine standing in for two nodes (c10d rendezvous on
127.0.0.1, the first agent hosting its store), started as users start them:
``ipycloud torchrun``."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

START_TIMEOUT_S = 120  # four workers import torch on two cores
RUN_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalNodes:
    """``count`` torchrun agents, ``nproc`` workers each, running ``script``; logs in
    ``logs``. Use as a context manager: every process they started is killed on exit."""

    def __init__(self, script: Path, arguments: Sequence[str], logs: Path, *,
                 nnodes: str = "2", count: int = 2, nproc: int = 2, max_restarts: int = 3,
                 environment: dict[str, str] | None = None, monitor_interval: float = 0.2,
                 last_call_timeout: int = 2,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.script, self.arguments, self.logs = script, list(arguments), logs
        self.nnodes, self.count, self.nproc = nnodes, count, nproc
        self.max_restarts = max_restarts
        self.monitor_interval, self.last_call_timeout = monitor_interval, last_call_timeout
        self.environment = environment or {}
        self.preexec_fn = preexec_fn  # what each agent is started with
        self.agents: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> LocalNodes:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def start(self) -> None:
        port = free_port()
        self.logs.mkdir(parents=True, exist_ok=True)
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **self.environment}
        for node in range(self.count):
            command = [sys.executable, "-m", "ipycloud", "torchrun",
                       f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc}",
                       "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                       f"--rdzv-conf=is_host={int(node == 0)},"
                       f"last_call_timeout={self.last_call_timeout}",
                       f"--max-restarts={self.max_restarts}",
                       f"--monitor-interval={self.monitor_interval:g}",
                       str(self.script), *self.arguments]
            with open(self.logs / f"node{node}.log", "ab") as log:
                self.agents.append(subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                    start_new_session=True, preexec_fn=self.preexec_fn))

    def workers(self, node: int) -> list[psutil.Process]:
        """The live workers of agent ``node``."""
        with contextlib.suppress(psutil.NoSuchProcess):
            return [child for child in psutil.Process(self.agents[node].pid).children()
                    if child.status() != psutil.STATUS_ZOMBIE]
        return []

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> list[int | None]:
        """The agents' exit statuses once all have ended; AssertionError with their logs
        if they have not ended in ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for agent in self.agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(max(0.1, deadline - time.monotonic()))
        codes = [agent.poll() for agent in self.agents]
        if None in codes:
            raise AssertionError(f"the agents did not end in {timeout:.0f} s "
                                 f"(statuses {codes}):\n{self.tail()}")
        return codes

    def signal_node(self, node: int, number: int) -> None:
        """Send ``number`` to agent ``node`` (it passes SIGTERM on to its workers)."""
        self.agents[node].send_signal(number)

    def kill_node(self, node: int) -> None:
        """The machine of agent ``node`` is gone: SIGKILL to the agent and its workers
        (torchrun starts each worker in a session of its own)."""
        _kill_tree(self.agents[node].pid)
        self.agents[node].wait(10)

    def kill(self) -> None:
        for agent in self.agents:
            _kill_tree(agent.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(10)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(f"--- {log.name}\n" + "\n".join(
            log.read_text(errors="replace").splitlines()[-lines:])
            for log in sorted(self.logs.glob("node*.log")))


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def wait_for(condition: Callable[[], bool], timeout: float, what: str,
             nodes: LocalNodes | None = None) -> None:
    """Poll ``condition`` every 0.1 s until it holds; AssertionError naming ``what`` (and
    the agents' logs) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            logs = f":\n{nodes.tail()}" if nodes is not None else ""
            raise AssertionError(f"{what} did not happen in {timeout:.0f} s{logs}")
        time.sleep(0.1)
