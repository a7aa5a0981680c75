"""``%keepalive`` in real kernels: SIGTERM, a shortened deadline, and a real culling server."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from jupyter_process import JupyterProcess
from kernels import kernel, run
from waiting import wait_for

from ipycloud.runtime.checkpoint import CheckpointManager

TRAINING_STATE = """\
%load_ext ipycloud
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
model(torch.randn(8, 4)).sum().backward()
optimizer.step()
"""


def test_sigterm_saves_a_complete_checkpoint_then_the_kernel_ends(tmp_path: Path) -> None:
    import torch

    folder, reference = tmp_path / "checkpoints", tmp_path / "reference.pt"
    with kernel(tmp_path) as (manager, client):
        run(client, TRAINING_STATE)
        run(client, f"%checkpoint auto model optimizer --dir {folder}")
        shown = run(client, "%keepalive start")
        assert "SIGTERM: guarded: deadline actions, then the process ends (grace 25 s)" in shown
        run(client, "model(torch.randn(8, 4)).sum().backward(); optimizer.step()\n"
                    f"torch.save({{'model': model.state_dict(), 'optimizer': "
                    f"optimizer.state_dict()}}, {str(reference)!r})")
        assert list(folder.iterdir()) == []  # made by auto, nothing saved before the signal
        process = manager.provisioner.process  # type: ignore[union-attr]
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=30) == -signal.SIGTERM  # ended by the signal, as it would
    (info,) = CheckpointManager(folder).list()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    CheckpointManager(folder).load({"model": model, "optimizer": optimizer})  # verifies the CRC
    expected = torch.load(reference, weights_only=True)
    for name, tensor in expected["model"].items():
        assert torch.equal(model.state_dict()[name], tensor)
    saved_moments = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(saved_moments, expected["optimizer"]["state"][0]["exp_avg"])
    assert info.step == 0


def test_a_shortened_deadline_runs_the_actions_once_per_warning(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    with kernel(tmp_path) as (_, client):
        run(client, TRAINING_STATE)
        run(client, f"%checkpoint auto model optimizer --dir {folder}")
        # The limit counts from the kernel's start: put it 4 s from now, warnings 3 s and 1 s
        # before it, so each warning point lies ahead.
        run(client, "import time, psutil\n"
                    "limit = f'{time.time() - psutil.Process().create_time() + 4:.2f}s'")
        start = client.execute_interactive(
            "%keepalive start --interval 1 --limit $limit --warn 3s,1s", timeout=60,
            output_hook=lambda message: None)
        assert start["content"]["status"] == "ok"
        wait_for(lambda: folder.is_dir() and len(CheckpointManager(folder).list()) == 2,
                   20, "a checkpoint per warning point")
        # The notices reach the frontend from the guard's threads, attached to the latest
        # cell (here %keepalive start): on stderr, and as updates of the magic's own output.
        stderr, updates = notices_shown(client, start["parent_header"]["msg_id"])
        assert stderr.count("running the deadline actions now") == 2
        assert stderr.count("ok - checkpoint auto: checkpoint step-") == 2
        assert "last run: deadline actions (" in updates[-1]
        wait_for(lambda: "the limit has passed" in run(client, "%keepalive status"), 20,
                   "the session limit to pass")
        status = run(client, "%keepalive status")
        assert [info.step for info in CheckpointManager(folder).list()] == [0, 1]
        assert "next warning: none left" in status
        assert "ok - checkpoint auto: checkpoint step-000000001: step 1," in status
        assert status.count("running the deadline actions now") == 2  # one notice per point
        run(client, "%keepalive stop")


def notices_shown(client: BlockingKernelClient, cell: str) -> tuple[str, list[str]]:
    """The guard's stderr text and its display updates, as a frontend receives them."""
    stderr, updates = "", []
    while stderr.count("deadline actions (") < 2 or len(updates) < 4:
        message = client.get_iopub_msg(timeout=20)
        if message["msg_type"] == "comm_msg":  # the activity pings, from no cell
            assert message["parent_header"] == {}
            continue
        assert message["parent_header"]["msg_id"] == cell
        if message["msg_type"] == "stream" and message["content"]["name"] == "stderr":
            stderr += message["content"]["text"]
        elif message["msg_type"] == "update_display_data":
            updates.append(message["content"]["data"]["text/plain"])
    return stderr, updates


# -- a real Jupyter server that culls idle kernels ---------------------------------------------

CULL_AFTER = 6  # seconds without activity before the server shuts a kernel down


class Server(JupyterProcess):
    """A ``jupyter server`` that culls idle kernels, spoken to over REST and websockets."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, root, arguments=[
            f"--MappingKernelManager.cull_idle_timeout={CULL_AFTER}",
            "--MappingKernelManager.cull_interval=1"])

    def kernels(self) -> dict[str, dict[str, Any]]:
        return {model["id"]: model for model in self.api("api/kernels")}

    def execute(self, kernel_id: str, code: str) -> list[dict[str, Any]]:
        """Run ``code`` over the kernel's websocket as a frontend does; the messages seen.

        The connection is closed afterwards: the culler spares kernels with connections.
        """
        import websocket

        url = f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"
        connection = websocket.create_connection(
            url, header=[f"Authorization: token {self.token}"], timeout=60)
        try:
            request = Session().msg("execute_request", {
                "code": code, "silent": False, "store_history": True, "user_expressions": {},
                "allow_stdin": False, "stop_on_error": True})
            connection.send(json.dumps({**request, "channel": "shell"}, default=json_default))
            messages, replied, idle = [], False, False
            while not (replied and idle):
                message = json.loads(connection.recv())
                messages.append(message)
                if message["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                    replied = replied or message["msg_type"] == "execute_reply"
                    idle = idle or message["content"].get("execution_state") == "idle"
            return messages
        finally:
            connection.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    jupyter = Server(tmp_path)
    try:
        jupyter.wait_ready()
        yield jupyter
    finally:
        jupyter.close()


def test_keepalive_keeps_a_kernel_from_being_culled(server: Server) -> None:
    guarded = server.api("api/kernels", "POST", {"name": "python3"})["id"]
    control = server.api("api/kernels", "POST", {"name": "python3"})["id"]
    server.execute(control, "%load_ext ipycloud")
    messages = server.execute(guarded, "%load_ext ipycloud\n%keepalive start --interval 1")
    replies = [message for message in messages if message["msg_type"] == "execute_reply"]
    assert replies[0]["content"]["status"] == "ok"
    # What a frontend receives for a ping: a comm message no frontend opened, from no cell.
    pings = server.execute(guarded, "import time; time.sleep(1.5)")
    (ping, *_) = [message for message in pings if message["msg_type"] == "comm_msg"]
    assert ping["content"]["comm_id"].startswith("ipycloud-keepalive-")
    assert ping["parent_header"] == {}
    quiet_since = time.monotonic()

    activity: list[str] = []

    def control_culled() -> bool:
        kernels = server.kernels()
        assert guarded in kernels, "the guarded kernel was culled"
        activity.append(kernels[guarded]["last_activity"])
        return control not in kernels

    wait_for(control_culled, 30, "the control kernel to be culled")
    wait_for(lambda: control_culled() and time.monotonic() - quiet_since > 2 * CULL_AFTER,
               30, "twice the cull timeout")
    kernels = server.kernels()
    assert kernels[guarded]["execution_state"] == "idle"  # not spared for being busy
    assert kernels[guarded]["connections"] == 0  # nor for being connected
    assert len(set(activity)) >= CULL_AFTER  # last_activity kept advancing, about once a second
    assert activity == sorted(activity)
