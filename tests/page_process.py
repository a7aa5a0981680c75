"""The dashboard page's server in a process of its own, on made-up readings, so a test can
pause the whole process (SIGSTOP) as a kernel busy in C code would leave it.

Run as a script it prints ``<port> <token>`` on one line and serves until killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ipycloud.runtime.monitor.sampler import Sampler
from ipycloud.runtime.monitor.samples import DiskSample, Sample

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]


def scripted_probe() -> Sample:
    """A reading with made-up figures, at the time it is taken."""
    return Sample(time=time.time(), cpu_percent=25.0, ram_used=4 * GIB, ram_limit=16 * GIB,
                  ram_available=12 * GIB, swap_used=0, swap_total=0, process_rss=GIB,
                  disks=(DiskSample(("working",), ("/work",), 100 * GIB, 10 * GIB, 90 * GIB),))


class PageProcess:
    """A child process serving the page at 0.1 s on ``scripted_probe``; a context manager
    that kills it on leaving."""

    def __init__(self) -> None:
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE,
                                        text=True, env=environment)
        assert self.process.stdout is not None
        port, self.token = self.process.stdout.readline().split()
        self.port = int(port)

    def pause(self) -> None:
        """Stop the whole process: no thread of it runs until ``resume()``."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def __enter__(self) -> PageProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def main() -> None:
    from ipycloud.runtime.monitor.webpage import PageServer

    server = PageServer(Sampler(interval=0.1, probe=scripted_probe), interval=0.1).start()
    print(server.port, server.token, flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
