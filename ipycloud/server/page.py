"""The dashboard page a kernel serves itself, served by the Jupyter server at
``<base_url>ipycloud/page`` under the server's own authentication, so that ``%dashboard
--web`` works from a browser on another machine (JupyterHub, Binder, a remote lab).

The page asks for ``api/reading``, ``api/history`` and ``api/runs`` relative to its own
address, which from ``<base_url>ipycloud/page`` are the extension's routes; its ``kernel``
parameter keeps the runs of that kernel. When the extension loads it puts the page's path
in the environment the server's kernels inherit (``SERVER_PAGE_ENV``): a kernel that finds
it there knows a server answers for its page.
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ipycloud.runtime.monitor.webpage import SERVER_PAGE_ENV, MissingPage, read_page
from ipycloud.server.handlers import AUTH_RESOURCE

PAGE_PATH = "ipycloud/page"


class PageHandler(JupyterHandler):
    """GET page: the dashboard page's HTML; 403 without a Jupyter user (no login redirect:
    the page lives in an iframe)."""

    auth_resource = AUTH_RESOURCE

    def get_login_url(self) -> str:
        if not self.current_user:
            raise web.HTTPError(403)
        return str(super().get_login_url())

    @web.authenticated
    @authorized
    def get(self) -> None:
        try:
            body = read_page()
        except MissingPage as error:
            raise web.HTTPError(500, "%s", str(error)) from None
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Referrer-Policy", "no-referrer")  # the address may hold a token
        self.finish(body)


def published_page_route(base_url: str) -> tuple[str, Any]:
    """The page's route under ``base_url``, published to the kernels the server starts."""
    path = url_path_join(base_url, PAGE_PATH)
    os.environ[SERVER_PAGE_ENV] = path
    return path, PageHandler
