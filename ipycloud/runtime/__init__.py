"""The shared runtime layer: pure Python under every front, never IPython or widgets.

By capability: ``machine`` (what this machine is), ``monitor`` (what it is doing),
``guard`` (keeping the session alive), ``checkpoint``, ``storage``, ``train``; beside them
the shared helpers ``durable``, ``messages``, ``units``, ``tables``, ``_optional``,
``per_process`` and ``lifetime``. The import order is kept by import-linter
(pyproject.toml).
"""
