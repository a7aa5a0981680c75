"""Start a Jupyter app whose process sees a fake NVML board in place of ``pynvml``.

Usage: ``python tests/fake_gpu_jupyter.py jupyter {lab,notebook,server} [arguments]``.
The environment names the board and its compute processes:

- ``IPYCLOUD_TEST_BOARD``: a board of ``fake_nvml.BOARDS``;
- ``IPYCLOUD_TEST_GPU_PROCESSES``: a JSON file ``{"<gpu index>": [[pid, MiB], ...]}``, read
  at every query, so a test can name the PIDs of kernels the server started.

The app runs in this process (``jupyter <app>`` would start another one, without the fake).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_nvml import BOARDS, build_module

APPS = {"lab": "jupyterlab.labapp", "notebook": "notebook.app",
        "server": "jupyter_server.serverapp"}


class ProcessesFromFile:
    """The compute processes of one GPU, as the JSON file says at the time of asking."""

    def __init__(self, path: Path, index: int) -> None:
        self.path, self.index = path, index

    def __iter__(self) -> Iterator[tuple[int, int]]:
        try:
            table = json.loads(self.path.read_text())
        except FileNotFoundError:
            return iter(())
        return iter([(int(pid), int(mib)) for pid, mib in table.get(str(self.index), [])])


def main() -> None:
    _, command, app, *arguments = sys.argv
    assert command == "jupyter" and app in APPS, f"usage: {__doc__}"
    board = BOARDS[os.environ["IPYCLOUD_TEST_BOARD"]]
    processes = Path(os.environ["IPYCLOUD_TEST_GPU_PROCESSES"])
    board = replace(board, gpus=[replace(gpu, processes=ProcessesFromFile(processes, index))
                                 for index, gpu in enumerate(board.gpus)])
    sys.modules["pynvml"] = build_module(board)
    sys.argv = [f"jupyter-{app}", *arguments]
    sys.exit(importlib.import_module(APPS[app]).main())


if __name__ == "__main__":
    main()
