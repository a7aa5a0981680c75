"""ipywidgets views of the runtime (``pip install 'ipycloud[widgets]'``).

Importing this package imports ipywidgets; ``%load_ext ipycloud`` never does. Without
ipywidgets, importing it raises an ImportError that names the pip extra.
"""

from __future__ import annotations

from ipycloud.runtime._optional import require

require("ipywidgets", "widgets")  # before the views, which import it by name

from ipycloud.widgets.dashboard import Dashboard, live_dashboard  # noqa: E402

__all__ = ["Dashboard", "live_dashboard"]
