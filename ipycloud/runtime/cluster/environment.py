"""What an exported task tells the code it runs: where the checkpoint bucket is mounted.

``checkpoint_dir("checkpoints")`` is the mounted bucket on the cluster and ``checkpoints``
in the notebook, so one training function runs in both places unchanged.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

CHECKPOINT_DIR_VARIABLE = "IPYCLOUD_CHECKPOINT_DIR"


def checkpoint_dir(default: str | os.PathLike[str], subfolder: str | None = None) -> str:
    """The checkpoint folder: ``$IPYCLOUD_CHECKPOINT_DIR`` (then ``subfolder`` in it) in a
    task written by ``ipycloud.cluster.export``, else ``default`` as given.

    ``subfolder`` keeps several runs apart in one bucket (``checkpoint_dir("ckpt",
    "resnet-lr0.1")``); it is a relative path that stays inside the bucket.
    """
    if subfolder is not None:
        _check_subfolder(subfolder)
    mounted = os.environ.get(CHECKPOINT_DIR_VARIABLE)
    if not mounted:
        return os.fspath(default)
    return mounted if subfolder is None else os.path.join(mounted, subfolder)


def _check_subfolder(subfolder: str) -> None:
    path = PurePosixPath(subfolder)
    if not subfolder or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"subfolder must be a relative path inside the bucket, like "
                         f"'run-1', not {subfolder!r}")
