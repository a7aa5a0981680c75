"""How ``%dashboard`` shows the dashboard page: through Colab's kernel-port iframe on Colab;
where the kernel was started by a Jupyter server with ipycloud's extension, the page that
server serves under its own authentication (so a browser on another machine reaches it);
elsewhere the page the kernel serves itself, in an iframe of the notebook (or as its address
in a terminal)."""

from __future__ import annotations

import html
import os
from urllib.parse import urlencode

from ipycloud.runtime.machine.platform import detect_platform
from ipycloud.runtime.monitor.dashboard_still import SNAPSHOT_CLASS, Snapshot
from ipycloud.runtime.monitor.sampler import Sampler, check_view_pace
from ipycloud.runtime.monitor.session import start_monitoring
from ipycloud.runtime.monitor.webpage import SERVER_PAGE_ENV, serve_page
from ipycloud.runtime.runs.recorder import kernel_id
from ipycloud.widgets.stills import Stills

# The page's cards (one per GPU, CPU and RAM, disks) sit three to a row in a notebook's
# output area: pixels for its header and the run of fit, and for each row of cards.
HEADER_PX = 64
RUN_PX = 280
CARD_ROW_PX = 250
CARDS_PER_ROW = 3


class PageView:
    """The dashboard page in an iframe where HTML is shown; elsewhere its address.

    Its output holds a snapshot of the dashboard and the iframe, hidden until the page
    says it is live (a message to this window): a notebook reopened once the kernel is gone,
    or untrusted (JupyterLab then removes iframes and their handlers), shows the snapshot.
    ``end()`` replaces its outputs by a snapshot taken then, which a notebook saved later
    keeps.
    """

    def __init__(self, url: str, height: int, sampler: Sampler) -> None:
        self.url = url
        self.height = height
        self.sampler = sampler
        self._stills = Stills()

    def _repr_html_(self) -> str:
        snapshot = Snapshot(self.sampler.latest() or self.sampler.sample_now(),
                            "shown where the live page is not")
        return (f'<div><iframe src="{html.escape(self.url)}" width="100%" '
                f'height="{self.height}" style="border: 0" title="ipycloud dashboard" hidden '
                f'onload="{html.escape(_SHOW_WHEN_LIVE)}"></iframe>{snapshot.html()}</div>')

    def _ipython_display_(self) -> None:
        self._stills.show({"text/html": self._repr_html_(), "text/plain": repr(self)})

    def end(self, note: str = "the live page ended") -> Snapshot | None:
        """Replace the view's outputs by a snapshot of the dashboard now."""
        return self._stills.freeze(self.sampler, note)

    def __repr__(self) -> str:
        if self.url.startswith("/"):
            return f"ipycloud dashboard page: {self.url} on the Jupyter server"
        return f"ipycloud dashboard page: {self.url} (%dashboard stop closes it)"


# The iframe's onload handler: once the page in it posts that it is live, the iframe shows
# and the snapshot beside it hides.
_SHOW_WHEN_LIVE = (
    "var frame = this, still = frame.parentNode.querySelector('." + SNAPSHOT_CLASS + "');"
    "window.addEventListener('message', function (event) {"
    " if (event.source === frame.contentWindow && event.data"
    " && event.data.ipycloud === 'live') { frame.hidden = false; still.hidden = true; } });")


def on_colab() -> bool:
    """Whether this kernel runs on Google Colab, where widget updates sent from a thread
    are not drawn (the page is the live view there)."""
    return detect_platform().key == "colab"


def show_page(interval: float, history: float) -> PageView | None:
    """Show the dashboard page with ``history`` seconds of sparklines: on Colab the kernel's
    page server (started at ``interval``) through Colab's kernel-port iframe, shown at once
    (None is returned); else a PageView to display, of the Jupyter server's page where that
    server has ipycloud's extension (it keeps its own pace), or of the kernel's server."""
    check_view_pace(interval, history)  # a mistake starts nothing
    server_page = os.environ.get(SERVER_PAGE_ENV)
    if server_page and not on_colab():
        sampler = start_monitoring()  # for %dashboard report, as the kernel's page does
        sample = sampler.latest() or sampler.sample_now()
        query = {"history": f"{history:g}", **kernel_query()}
        return PageView(f"{server_page}?{urlencode(query)}", page_height(len(sample.gpus)),
                        sampler)
    server = serve_page(interval)
    height = page_height(len(server.latest().gpus))
    if on_colab():
        from google.colab import output

        output.serve_kernel_port_as_iframe(server.port, path=server.path(history),
                                           height=str(height))
        return None
    return PageView(server.url(history), height, server.sampler)


def page_height(gpus: int) -> int:
    """Pixels the page takes without scrolling, with ``gpus`` GPU cards."""
    rows = -(-(gpus + 2) // CARDS_PER_ROW)
    return HEADER_PX + RUN_PX + CARD_ROW_PX * rows


def kernel_query() -> dict[str, str]:
    """``{"kernel": <this Jupyter kernel's id>}``, so that the server's page shows this
    kernel's runs; empty outside a Jupyter kernel."""
    kernel = kernel_id()
    return {"kernel": kernel} if kernel else {}
