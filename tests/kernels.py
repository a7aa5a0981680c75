"""Real Jupyter kernels for tests: whole notebooks through nbclient, or one kernel driven
cell by cell through jupyter_client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from jupyter_process import JupyterProcess
from nbclient import NotebookClient


def execute(notebook: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    NotebookClient(notebook, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook


def outputs(cell: nbformat.NotebookNode) -> dict[str, object]:
    """All MIME bundles a cell produced, merged."""
    merged: dict[str, object] = {}
    for output in cell.outputs:
        merged.update(output.get("data", {}))
        if output.output_type == "stream":
            merged[output.name] = merged.get(output.name, "") + output.text
    return merged


@contextmanager
def kernel(cwd: Path, **launch: Any) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """A real ipykernel in its own process, shut down (if still alive) afterwards;
    ``launch`` goes to its Popen (``stderr=file``: what a Jupyter server logs of it)."""
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(cwd), **launch)
    try:
        with ready(manager.client()) as client:
            yield manager, client
    finally:
        if manager.is_alive():
            manager.shutdown_kernel(now=True)
        manager.cleanup_resources()


@contextmanager
def session_kernel(server: JupyterProcess, notebook: str, base_url: str = "/"
                   ) -> Iterator[tuple[str, BlockingKernelClient]]:
    """The id of a kernel that ``server`` (at ``base_url``) started for ``notebook``, and a
    client of it."""
    session = server.api(f"{base_url.lstrip('/')}api/sessions", "POST", {
        "path": notebook, "type": "notebook", "name": "", "kernel": {"name": "python3"}})
    kernel_id = session["kernel"]["id"]
    client = BlockingKernelClient(connection_file=str(
        Path(server.env["JUPYTER_RUNTIME_DIR"]) / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    with ready(client):
        yield kernel_id, client


@contextmanager
def ready(client: BlockingKernelClient) -> Iterator[BlockingKernelClient]:
    """``client`` with its channels started and its kernel answering; stopped afterwards."""
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield client
    finally:
        client.stop_channels()


def run(client: BlockingKernelClient, code: str) -> str:
    """Execute ``code``; its text output, or the test fails with the error it raised."""
    texts: list[str] = []

    def collect(message: dict[str, Any]) -> None:
        content = message["content"]
        if message["msg_type"] == "stream":
            texts.append(content["text"])
        elif message["msg_type"] in ("execute_result", "display_data"):
            texts.append(content["data"].get("text/plain", ""))
        elif message["msg_type"] == "error":
            texts.append("\n".join(content["traceback"]))

    reply = client.execute_interactive(code, timeout=60, output_hook=collect)
    assert reply["content"]["status"] == "ok", "".join(texts)
    return "".join(texts)
