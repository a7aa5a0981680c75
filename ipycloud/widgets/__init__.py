"""ipywidgets views of the runtime (``pip install 'ipycloud[widgets]'``).

Importing this package imports ipywidgets; ``%load_ext ipycloud`` never does.
"""

from __future__ import annotations

from ipycloud.widgets.dashboard import Dashboard, live_dashboard

__all__ = ["Dashboard", "live_dashboard"]
