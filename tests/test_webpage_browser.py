"""The page a real kernel serves (``%dashboard --web``), in headless Chromium (``browser``),
shown as the notebook would show it (the magic's iframe): it keeps moving while the kernel
sleeps in a cell, refuses requests without its token, and says "kernel gone" once
``%dashboard stop`` closed its port and once the kernel died. A screenshot is kept."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from browser import ARTIFACTS, browser_page, missing_requirements
from jupyter_process import refused
from kernels import kernel, run
from waiting import wait_for

TESTS = Path(__file__).parent
# The kernel's NVML answers from the fake T4 board (the machine has no GPU).
FAKE_T4 = (f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
           "from fake_nvml import BOARDS, build_module\n"
           "sys.modules['pynvml'] = build_module(BOARDS['1xT4'])\n")
SHOW_PAGE = ("%load_ext ipycloud\n"
             "view = %dashboard --web --interval 0.5 --history 30s\n"
             "print(view._repr_html_())")
SLEEP_S = 20


@pytest.fixture(autouse=True)
def _browser_needed() -> None:
    if missing := missing_requirements():
        pytest.fail("the browser test needs " + "; ".join(missing))


def port_of(iframe_html: str) -> int:
    src = iframe_html.split('src="', 1)[1].split('"', 1)[0]
    return urlsplit(src).port or 0


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def points(frame: Any) -> int:
    """How many points the CPU sparkline draws."""
    value = frame.locator('[data-ipycloud-metric="cpu"] svg').get_attribute(
        "data-ipycloud-points")
    return int(value or 0)


def test_the_page_stays_live_while_a_cell_runs_and_says_when_the_kernel_is_gone(
        tmp_path: Path) -> None:
    with kernel(tmp_path) as (manager, client), browser_page(1000, 700) as page:
        run(client, FAKE_T4)
        iframe = run(client, SHOW_PAGE).strip()
        port = port_of(iframe)
        try:
            page.set_content(f"<body style='margin:0'>{iframe}</body>")
            frame = page.frame_locator("iframe")
            body = frame.locator("body")
            frame.locator("[data-ipycloud-status='live']").wait_for(timeout=20_000)
            frame.get_by_text("GPU 0 · Tesla T4").wait_for()
            # the platform the kernel detected, and each disk by what can still be written
            assert frame.locator(".ipycloud-Page-platform").inner_text() == "Local machine"
            assert frame.locator('[data-ipycloud-metric="ram"]').is_visible()
            assert not frame.locator('[data-ipycloud-metric="jupyter"]').is_visible()  # no server
            disk = frame.locator('[data-ipycloud-metric^="disk-"] .ipycloud-Metric-value').first
            assert re.fullmatch(r"[\d.]+ (MiB|GiB|TiB) free of [\d.]+ \1 \(\d+% used\)",
                                disk.inner_text())

            sent = time.monotonic()
            client.execute(f"import time; time.sleep({SLEEP_S})")
            first_time, first_points = body.get_attribute("data-ipycloud-time"), points(frame)
            wait_for(lambda: points(frame) >= first_points + 6, 15,
                     "six new points on the CPU sparkline while the kernel sleeps")
            assert body.get_attribute("data-ipycloud-time") != first_time
            assert time.monotonic() - sent < SLEEP_S - 2
            assert not client.shell_channel.msg_ready()  # the cell is still running
            page.locator("iframe").screenshot(path=str(ARTIFACTS / "dashboard-webpage.png"))

            assert status_of(f"http://127.0.0.1:{port}/api/reading") == 403
            assert status_of(f"http://127.0.0.1:{port}/") == 403
            reply = client.get_shell_msg(timeout=SLEEP_S + 30)
            assert reply["content"]["status"] == "ok"

            stopped = run(client, "%dashboard stop")
            assert f"the dashboard page (port {port} closed)" in stopped
            assert refused(port)
            frame.get_by_text("kernel gone", exact=True).wait_for(timeout=15_000)
            assert body.get_attribute("data-ipycloud-status") == "gone"

            iframe = run(client, "view = %dashboard --web --interval 0.5\n"
                                 "print(view._repr_html_())").strip()
            port = port_of(iframe)
            page.set_content(f"<body style='margin:0'>{iframe}</body>")
            frame.locator("[data-ipycloud-status='live']").wait_for(timeout=20_000)
            manager.shutdown_kernel(now=True)  # killed, as the out-of-memory killer would
            wait_for(lambda: refused(port), 10, "the dead kernel's port to close")
            frame.get_by_text("kernel gone", exact=True).wait_for(timeout=15_000)
            page.locator("iframe").screenshot(path=str(ARTIFACTS / "dashboard-webpage-gone.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "dashboard-webpage-failure.png"))
            raise
    assert (ARTIFACTS / "dashboard-webpage.png").stat().st_size > 10_000
