"""How ``%dashboard`` shows the page the kernel serves itself: through Colab's kernel-port
iframe on Colab, elsewhere in an iframe of the notebook (or as its address in a terminal)."""

from __future__ import annotations

import html

from ipycloud.runtime.machine.platform import detect_platform
from ipycloud.runtime.monitor.sampler import check_view_pace
from ipycloud.runtime.monitor.webpage import serve_page

# The page's cards (one per GPU, CPU and RAM, disks) sit three to a row in a notebook's
# output area: pixels for its header, and for each row of cards.
HEADER_PX = 64
CARD_ROW_PX = 250
CARDS_PER_ROW = 3


class PageView:
    """The dashboard page in an iframe where HTML is shown; elsewhere its address."""

    def __init__(self, url: str, height: int) -> None:
        self.url = url
        self.height = height

    def _repr_html_(self) -> str:
        return (f'<iframe src="{html.escape(self.url)}" width="100%" height="{self.height}" '
                'style="border: 0" title="ipycloud dashboard"></iframe>')

    def __repr__(self) -> str:
        return f"ipycloud dashboard page: {self.url} (%dashboard stop closes it)"


def on_colab() -> bool:
    """Whether this kernel runs on Google Colab, where widget updates sent from a thread
    are not drawn (the page is the live view there)."""
    return detect_platform().key == "colab"


def show_page(interval: float, history: float) -> PageView | None:
    """Start (or keep) the kernel's page server at ``interval`` and show its page with
    ``history`` seconds of sparklines: on Colab through its kernel-port iframe, shown at
    once (None is returned); elsewhere as a PageView to display."""
    check_view_pace(interval, history)  # a mistake starts nothing
    server = serve_page(interval)
    height = page_height(len(server.latest().gpus))
    if on_colab():
        from google.colab import output

        output.serve_kernel_port_as_iframe(server.port, path=server.path(history),
                                           height=str(height))
        return None
    return PageView(server.url(history), height)


def page_height(gpus: int) -> int:
    """Pixels the page takes without scrolling, with ``gpus`` GPU cards."""
    rows = -(-(gpus + 2) // CARDS_PER_ROW)
    return HEADER_PX + CARD_ROW_PX * rows
