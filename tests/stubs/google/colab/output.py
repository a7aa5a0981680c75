"""``google.colab.output`` with the real signature of ``serve_kernel_port_as_iframe``.

Colab displays an iframe whose requests its front end forwards to ``port`` on the kernel's
machine; here ``calls`` records every call's arguments, and nothing is displayed.
"""

from __future__ import annotations

from typing import Any

calls: list[dict[str, Any]] = []


def serve_kernel_port_as_iframe(port: int, path: str = "/", width: str = "100%",
                                height: str = "400", cache_in_notebook: bool = False) -> None:
    """Show the kernel's ``port`` at ``path`` in an iframe (here: record the call)."""
    calls.append({"port": port, "path": path, "width": width, "height": height,
                  "cache_in_notebook": cache_in_notebook})
