"""From a notebook to a cluster: ``export`` writes a SkyPilot task that trains a function
(or a script) on several machines under torchrun, with checkpoints in a bucket;
``checkpoint_dir`` finds that bucket on the nodes.

``options`` (the choices, checked), ``imports`` and ``pins`` (the packages the training
needs, at the notebook's versions), ``payload`` (the function, pickled by value),
``task`` (the task file, written by ``yaml_text``), ``export``; on the nodes,
``worker`` (run by torchrun) and ``environment`` (``checkpoint_dir``).

May import ``train`` and what lies below it; nothing in the runtime imports it, only the
fronts.
"""

from ipycloud.runtime.cluster.environment import checkpoint_dir
from ipycloud.runtime.cluster.export import ClusterWarning, ExportedTask, export
from ipycloud.runtime.cluster.options import ExportError

__all__ = ["ClusterWarning", "ExportError", "ExportedTask", "checkpoint_dir", "export"]
