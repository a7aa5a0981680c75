"""What ``fit`` shows in a notebook beside its progress bar, with nothing but IPython.

Loaded with ``ipycloud.fit`` and by ``%load_ext ipycloud``; in a terminal or a script it
shows nothing.
"""

from __future__ import annotations

from ipycloud.notebook.curves import follow_runs

__all__ = ["follow_runs"]
