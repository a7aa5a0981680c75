"""An exported task's ``run`` script, run with bash as SkyPilot runs it on each node: two
"nodes" on 127.0.0.1 (one torchrun agent each), real workers loading the pickled training
function, real gloo DDP, real ``fit`` checkpoints; a worker killed with SIGKILL mid-run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
import torch
import yaml
from local_nodes import free_port
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from waiting import wait_for

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.cluster import checkpoint_dir, export
from ipycloud.runtime.train.callback import Callback

REPO = Path(__file__).resolve().parents[1]
STEPS, EVERY, PER_RANK_BATCH = 30, 5, 4
RUN_TIMEOUT_S = 200.0  # one run; a test runs two


class Slowly(Callback):
    """Sleeps after each step, so a worker can be killed mid-run (the results do not
    depend on it)."""

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        time.sleep(0.1)


def train_on_the_cluster(steps: int, per_rank_batch: int) -> None:
    """The exported function: trains in every worker, rank 0 keeps the final weights and
    notes each start, all in the folder the task mounts."""
    import ipycloud

    folder = Path(checkpoint_dir("never used here"))
    if torch.distributed.get_rank() == 0:
        with open(folder / "starts.txt", "a") as starts:
            starts.write("start\n")
    generator = torch.Generator().manual_seed(5)
    inputs = torch.randn(256, 6, generator=generator)
    data = TensorDataset(inputs, inputs[:, :3].argmax(dim=1))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    ipycloud.fit(model, optimizer, DataLoader(data, batch_size=per_rank_batch, shuffle=True),
                 max_steps=steps, precision="fp32", device="cpu", progress=False, seed=11,
                 checkpoint=str(folder), checkpoint_every_steps=EVERY, callbacks=[Slowly()])
    if torch.distributed.get_rank() == 0:
        torch.save(model.state_dict(), folder / "final.pt")


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("task") / "cluster 'task'"
    export(train_on_the_cluster, folder=folder, bucket="s3://checkpoints/run", nodes=2,
           args=(STEPS, PER_RANK_BATCH))
    return folder, yaml.safe_load((folder / "task.yaml").read_text())


@contextlib.contextmanager
def nodes_running(task: tuple[Path, dict[str, Any]], nodes: int, gpus: int,
                  checkpoints: Path, logs: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The task's run script on ``nodes`` "nodes" of this machine, with SkyPilot's variables
    and the task's environment; the local checkpoint folder stands in for the bucket."""
    folder, config = task
    port = free_port()
    agents: list[subprocess.Popen[bytes]] = []
    outputs: list[IO[bytes]] = []
    try:
        for rank in range(nodes):
            env = {**os.environ, **config["envs"],
                   "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * nodes),
                   "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": str(nodes),
                   "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus),
                   "IPYCLOUD_RDZV_PORT": str(port), "IPYCLOUD_CHECKPOINT_DIR": str(checkpoints),
                   "IPYCLOUD_VENV": sys.prefix, "PYTHONPATH": str(REPO),
                   "OMP_NUM_THREADS": "1"}
            outputs.append(open(logs / f"node-{rank}.log", "wb"))  # noqa: SIM115
            agents.append(subprocess.Popen(["bash", "-c", config["run"]], cwd=folder, env=env,
                                           stdout=outputs[-1], stderr=subprocess.STDOUT,
                                           start_new_session=True))
        yield agents
    finally:
        for agent in agents:  # torchrun starts each worker in a session of its own
            for process in descendants(agent):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            agent.kill()
            agent.wait(10)
        for output in outputs:
            output.close()


def finish(agents: list[subprocess.Popen[bytes]], logs: Path) -> None:
    """Every node's run script ends, and well, within RUN_TIMEOUT_S."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for agent in agents:
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(max(0.1, deadline - time.monotonic()))
    statuses = [agent.poll() for agent in agents]
    tails = "".join(log.read_text(errors="replace")[-3000:] for log in sorted(logs.glob("*")))
    assert statuses == [0] * len(agents), f"statuses {statuses} (None: still running)\n{tails}"


def descendants(agent: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The processes under a node's shell: torchrun's agent, its workers."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(agent.pid).children(recursive=True)
    return []


def workers_of(agents: list[subprocess.Popen[bytes]]) -> list[psutil.Process]:
    found = []
    for process in (process for agent in agents for process in descendants(agent)):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "ipycloud.runtime.cluster.worker" in process.cmdline():
                found.append(process)
    return found


def train(task: tuple[Path, dict[str, Any]], nodes: int, gpus: int, where: Path,
          kill_a_worker: bool) -> dict[str, torch.Tensor]:
    checkpoints, logs = where / "bucket", where / "logs"
    checkpoints.mkdir(parents=True)
    logs.mkdir()
    with nodes_running(task, nodes, gpus, checkpoints, logs) as agents:
        if kill_a_worker:
            wait_for(lambda: CheckpointManager(checkpoints).list(), timeout=RUN_TIMEOUT_S,
                     what="the first checkpoint", step=0.1)
            victim = max(workers_of(agents), key=lambda worker: worker.pid)
            victim.send_signal(signal.SIGKILL)
        finish(agents, logs)
    starts = (checkpoints / "starts.txt").read_text().split()
    # After a kill the group started again (on two nodes, both agents may each restart it).
    assert len(starts) > 1 if kill_a_worker else len(starts) == 1
    state: dict[str, torch.Tensor] = torch.load(checkpoints / "final.pt", weights_only=True)
    return state


SCRIPT = """
import json, os, sys
from ipycloud.cluster import checkpoint_dir

with open(os.path.join(checkpoint_dir("unused"), "rank-" + os.environ["RANK"] + ".json"),
          "w") as out:
    json.dump({"argv": sys.argv[1:], "world": os.environ["WORLD_SIZE"],
               "here": os.environ["LOCAL_WORLD_SIZE"]}, out)
"""


def test_a_script_runs_with_its_arguments_one_process_on_each_cpu_node(
        tmp_path: Path) -> None:
    script = tmp_path / "my 'train' script.py"
    script.write_text(SCRIPT)
    folder = tmp_path / 'the "task"'
    arguments = ["--note", "it's \"quoted\"", "two  spaces", "$HOME"]
    export(script, folder=folder, bucket="gs://checkpoints", nodes=2, args=arguments)
    task = (folder, yaml.safe_load((folder / "task.yaml").read_text()))
    bucket, logs = tmp_path / "bucket", tmp_path / "logs"
    bucket.mkdir()
    logs.mkdir()
    with nodes_running(task, nodes=2, gpus=0, checkpoints=bucket, logs=logs) as agents:
        finish(agents, logs)
    reports = sorted(bucket.glob("rank-*.json"))
    assert [report.name for report in reports] == ["rank-0.json", "rank-1.json"]
    for report in reports:
        assert json.loads(report.read_text()) == {"argv": arguments, "world": "2", "here": "1"}


def assert_bit_for_bit(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name in left:
        assert torch.equal(left[name], right[name]), name


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("nodes", [1, 2])
def test_a_killed_worker_restarts_the_group_and_ends_bit_for_bit(
        nodes: int, task: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """Two processes on each node: world size 2 on one node, 4 on two."""
    whole = train(task, nodes, gpus=2, where=tmp_path / "whole", kill_a_worker=False)
    killed = train(task, nodes, gpus=2, where=tmp_path / "killed", kill_a_worker=True)
    assert_bit_for_bit(whole, killed)
