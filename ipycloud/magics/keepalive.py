"""`%keepalive`: Keep the session alive and guard it against its deadline and preemption."""

from __future__ import annotations

from IPython.core.magic import Magics, magics_class


@magics_class
class KeepaliveMagics(Magics):
    """Keep the session alive and guard it against its deadline and preemption."""
