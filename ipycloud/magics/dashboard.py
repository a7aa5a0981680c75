"""`%dashboard`: Live resource dashboards, per-cell resource use and the usage report."""

from __future__ import annotations

from IPython.core.magic import Magics, magics_class


@magics_class
class DashboardMagics(Magics):
    """Live resource dashboards, per-cell resource use and the usage report."""
