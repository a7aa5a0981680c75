"""The routes of the extension under ``<base_url>ipycloud/api/``."""

from __future__ import annotations

from typing import Any

from jupyter_server.utils import url_path_join

from ipycloud.server.handlers import (
    SETTINGS_KEY,
    EventsHandler,
    HistoryHandler,
    KernelHandler,
    KernelsHandler,
    ReadingHandler,
    RunHandler,
    RunsHandler,
    Services,
)

API_PATH = "ipycloud/api"


def add_routes(web_app: Any, services: Services) -> None:
    """Add the handlers to the server's web application, serving ``services``."""
    base = url_path_join(web_app.settings["base_url"], API_PATH)
    web_app.settings[SETTINGS_KEY] = services
    web_app.add_handlers(".*$", [
        (url_path_join(base, "reading"), ReadingHandler),
        (url_path_join(base, "history"), HistoryHandler),
        (url_path_join(base, "kernels"), KernelsHandler),
        (url_path_join(base, "kernels", "(?P<kernel_id>[^/]+)"), KernelHandler),
        (url_path_join(base, "events"), EventsHandler),
        (url_path_join(base, "runs"), RunsHandler),
        (url_path_join(base, "runs", "(?P<run_id>[^/]+)"), RunHandler),
    ])
