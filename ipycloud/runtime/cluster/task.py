"""The SkyPilot task: resources, mounts, environment, and the setup and run scripts.

Every node mounts the checkpoint bucket at one path in MOUNT_CACHED mode: fit writes each
checkpoint to a temporary name and renames it, and appends lines to its run record; plain
MOUNT (goofys on S3) supports neither appends nor random writes, while MOUNT_CACHED
(rclone's full VFS cache) does both, writes at local-disk speed and uploads in the
background, and SkyPilot holds the job's end until the uploads are done. A checkpoint
whose upload a preemption cut off is incomplete in the bucket: a resume takes the newest
complete one.

The run script starts ``ipycloud torchrun`` on each node: the first of
``SKYPILOT_NODE_IPS`` hosts the rendezvous, each node gives its own address, and a failed
worker restarts the whole group (``--max-restarts``), which resumes from the newest
checkpoint. A managed job (``sky jobs launch``) that loses its nodes is relaunched and
resumes from the bucket the same way.
"""

from __future__ import annotations

import posixpath
import shlex
import textwrap
from dataclasses import dataclass
from typing import Any

from ipycloud.runtime.cluster.environment import CHECKPOINT_DIR_VARIABLE
from ipycloud.runtime.cluster.options import CHECKPOINT_MOUNT, Accelerators, Mount
from ipycloud.runtime.cluster.shell_words import shell_word
from ipycloud.runtime.cluster.yaml_text import to_yaml

TASK_FILE = "task.yaml"
REQUIREMENTS_FILE = "requirements.txt"
PORT_VARIABLE = "IPYCLOUD_RDZV_PORT"
DEFAULT_PORT = 29500
VENV_VARIABLE = "IPYCLOUD_VENV"
# Where setup makes the nodes' environment, unless the task's environment says otherwise.
DEFAULT_VENV = "$HOME/.ipycloud/venv"
RECOVERY_STRATEGY = "EAGER_NEXT_REGION"


@dataclass(frozen=True)
class Plan:
    """Everything the task file says."""

    name: str
    nodes: int
    accelerators: Accelerators | None
    use_spot: bool
    max_restarts: int
    bucket: str
    data: tuple[Mount, ...]
    folder: str  # absolute: uploaded to every node as the working directory
    python: str  # major.minor
    program: tuple[str, ...]  # what torchrun starts in each process, with its arguments


def task_yaml(plan: Plan) -> str:
    """The task file's text."""
    return to_yaml(task_config(plan), comments=(
        "Written by ipycloud.cluster.export. Launch it as a managed job, which is",
        "relaunched after a preemption and resumes from the checkpoint bucket:",
        f"  sky jobs launch {shell_word(posixpath.join(plan.folder, TASK_FILE))}"))


def task_config(plan: Plan) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if plan.accelerators is not None:
        resources["accelerators"] = str(plan.accelerators)
    if plan.use_spot:
        resources["use_spot"] = True
    resources["job_recovery"] = {"strategy": RECOVERY_STRATEGY}
    mounts: dict[str, Any] = {CHECKPOINT_MOUNT: {"source": plan.bucket,
                                                 "mode": "MOUNT_CACHED"}}
    for mount in plan.data:
        mounts[mount.path] = ({"source": mount.source, "mode": "MOUNT"} if mount.is_bucket
                              else mount.source)
    return {
        "name": plan.name,
        "num_nodes": plan.nodes,
        "resources": resources,
        "workdir": plan.folder,
        "file_mounts": mounts,
        "envs": {CHECKPOINT_DIR_VARIABLE: CHECKPOINT_MOUNT, PORT_VARIABLE: str(DEFAULT_PORT)},
        "setup": setup_script(plan.python),
        "run": run_script(plan.max_restarts, plan.program),
    }


def setup_script(python: str) -> str:
    """Every node: the notebook's Python version in an environment of its own (uv fetches
    that version where the image has another), with the pinned packages."""
    return textwrap.dedent(f"""\
        set -euo pipefail
        # Python {python} as in the notebook: a pickled function only loads in its own version.
        export PATH="$HOME/.local/bin:$PATH"
        command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh
        venv="${{{VENV_VARIABLE}:-{DEFAULT_VENV}}}"
        uv venv --python {python} --allow-existing "$venv"
        uv pip install --python "$venv/bin/python" -r {REQUIREMENTS_FILE}
        """)


def run_script(max_restarts: int, program: tuple[str, ...]) -> str:
    """Every node: one torchrun agent with as many processes as the node has GPUs (one on
    a CPU node). No ``exec`` and no ``set -e``: SkyPilot appends to this script its wait
    for the cached mount's uploads."""
    lines = [
        'head=$(echo "$SKYPILOT_NODE_IPS" | sed -n 1p)',
        'here=$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK + 1))p")',
        "is_host=$((SKYPILOT_NODE_RANK == 0 ? 1 : 0))",
        "nproc=$((SKYPILOT_NUM_GPUS_PER_NODE > 0 ? SKYPILOT_NUM_GPUS_PER_NODE : 1))",
        f'venv="${{{VENV_VARIABLE}:-{DEFAULT_VENV}}}"',
        '"$venv/bin/python" -m ipycloud torchrun \\',
        '  --nnodes="$SKYPILOT_NUM_NODES" --nproc-per-node="$nproc" \\',
        f'  --rdzv-backend=c10d --rdzv-endpoint="$head:${PORT_VARIABLE}" \\',
        '  --rdzv-conf="is_host=$is_host" --local-addr="$here" \\',
        f"  --max-restarts={max_restarts} \\",
        f"  {shlex.join(program)}",
    ]
    return "\n".join(lines) + "\n"
