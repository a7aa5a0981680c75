"""Real Jupyter kernels for tests: whole notebooks through nbclient, or one kernel driven
cell by cell through jupyter_client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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


def cell_messages(client: BlockingKernelClient, code: str,
                  on_message: Callable[[dict[str, Any]], None] = lambda message: None,
                  timeout: float = 120.0) -> tuple[list[dict[str, Any]], str]:
    """Execute ``code``: the output messages it sent (stream, display_data,
    update_display_data, error) until the kernel was idle again, and the status of its
    reply; ``on_message`` is called with each as it comes."""
    message_id = client.execute(code)
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = client.get_iopub_msg(timeout=deadline - time.monotonic())
        if message["parent_header"].get("msg_id") != message_id:
            continue
        kind = message["msg_type"]
        if kind == "status" and message["content"]["execution_state"] == "idle":
            reply = client.get_shell_msg(timeout=10)
            while reply["parent_header"].get("msg_id") != message_id:  # an earlier request's
                reply = client.get_shell_msg(timeout=10)
            return received, reply["content"]["status"]
        if kind in ("stream", "display_data", "update_display_data", "error"):
            received.append(message)
            on_message(message)
    raise AssertionError(f"the cell did not finish in {timeout} s")


def drawings(received: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(message type, display id, HTML) of each output that holds an SVG chart."""
    return [(message["msg_type"], message["content"]["transient"].get("display_id", ""),
             message["content"]["data"]["text/html"]) for message in received
            if "<svg" in message["content"].get("data", {}).get("text/html", "")]


def stream(received: list[dict[str, Any]], name: str) -> str:
    """The text ``received`` printed on the stream ``name`` (stdout, stderr)."""
    return "".join(message["content"]["text"] for message in received
                   if message["msg_type"] == "stream" and message["content"]["name"] == name)
