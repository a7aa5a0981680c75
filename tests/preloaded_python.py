"""A Python interpreter with torch and ipycloud imported that runs each script in a child
forked from it: a script run as ``python script.py`` would be, its import of torch aside.

The child makes a session of its own (as a terminal's foreground job: Ctrl-C reaches its
whole group), writes its output to a log, and ends as a script does: its exception or
``SystemExit`` leaves through this module's top level, so the interpreter shuts down as
it would after any script (threads joined, exit handlers run: multiprocessing's joins
its daemonic children there). Nothing here registers an exit handler or a thread.

Protocol: one JSON line on stdin per script, ``{"argv": [...], "log": path, "env": {...}}``;
one line back on stdout, the child's PID. Children are reaped as they end. Use
``PreloadedPython`` from the driver's side.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

PRELOADED = ("torch", "torch.utils.data", "torch.distributed", "ipycloud", "psutil")


def _serve() -> None:
    """Fork a child for each request; return (raising SystemExit) only in a child."""
    for name in PRELOADED:
        __import__(name)
    while True:
        if select.select([sys.stdin], [], [], 0.1)[0]:
            line = sys.stdin.readline()
            if not line:
                return
            pid = os.fork()
            if pid == 0:
                _become_the_script(json.loads(line))
            print(pid, flush=True)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


def _become_the_script(request: dict[str, Any]) -> None:
    """In the child: run the script; raises what the script raises, SystemExit at last."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, null), (1, log), (2, log)):
        os.dup2(source, target)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.path[0] = str(Path(sys.argv[0]).resolve().parent)
    runpy.run_path(sys.argv[0], run_name="__main__")
    raise SystemExit(0)


class PreloadedPython:
    """The driver's side: start scripts in forked children of one preloaded interpreter."""

    def __init__(self, environment: dict[str, str],
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=environment,
                                        preexec_fn=preexec_fn)
        self._stdin: IO[str] = self.process.stdin  # type: ignore[assignment]
        self._stdout: IO[str] = self.process.stdout  # type: ignore[assignment]

    def start(self, argv: list[str], log: Path, environment: dict[str, str]) -> int:
        """Run ``argv`` (a script and its arguments) in a new child; its PID."""
        self._stdin.write(json.dumps({"argv": argv, "log": str(log),
                                      "env": environment}) + "\n")
        self._stdin.flush()
        return int(self._stdout.readline())

    def close(self) -> None:
        self._stdin.close()
        self.process.wait(30)
        self._stdout.close()


if __name__ == "__main__":
    _serve()
