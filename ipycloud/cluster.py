"""``ipycloud.cluster``: from a notebook to a cluster in one call.

``export(train, folder=..., bucket=..., nodes=2, accelerators="A100:8")`` writes a SkyPilot
task that ``sky jobs launch`` runs; ``checkpoint_dir(default)`` is the checkpoint bucket on
the cluster and ``default`` anywhere else.
"""

from ipycloud.runtime.cluster import (
    ClusterWarning,
    ExportedTask,
    ExportError,
    checkpoint_dir,
    export,
)

__all__ = ["ClusterWarning", "ExportError", "ExportedTask", "checkpoint_dir", "export"]
