"""The Jupyter server extension of ipycloud: readings of the machine (a day of them, kept
across restarts), the kernels' use of it, why kernels died and the runs of ``fit``, as JSON
under ``<base_url>ipycloud/api/`` (README.md beside this module describes each route).

The wheel enables it with ``jupyter_server_config.d/ipycloud.json``; by hand:
``jupyter server --ServerApp.jpserver_extensions='{"ipycloud.server": true}'``. This module
holds only the hooks the server looks for: jupyter_server is imported when the server loads
the extension, never by ``import ipycloud``.
"""

from __future__ import annotations

from typing import Any

from ipycloud._version import __version__  # shown by ``jupyter server extension list``

__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The extension points of this package: this module."""
    return [{"module": "ipycloud.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Start the server's monitor and add the routes (called once by jupyter_server)."""
    from ipycloud.server.extension import load

    load(serverapp)
