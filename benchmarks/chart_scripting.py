"""Benchmark: the browser's scripting time a chart view costs, per minute, refreshed once a
second: ipycloud's machine chart view against jupyterlab-nvdashboard's "Machine Resources".

One real ``jupyter lab`` (without a GPU: the machine's CPU, RAM, disks and network), the
lab extension of this checkout first on ``JUPYTER_PATH``, ipycloud's panel and charts set
to ask every second (``refreshInterval: 1``; the server samples every second). The server
starts with a day of readings in its history file, thinned as it keeps them (one a second
for the last hour, one a minute before): ipycloud's chart view draws all of them, as it
would after a day. nvdashboard keeps no history: its charts start empty. With
``--nvdashboard-python`` (a Python where ``jupyterlab_nvdashboard`` is installed, e.g. a
throwaway venv) the same server also runs nvdashboard, set to update every second
(``updateFrequency: 1000``).

Headless Chromium (Debian's) opens JupyterLab, then for each condition in turn
(A B C C B A ...) waits ``WINDOW_S`` and reads Chrome's ``Performance.getMetrics`` through
a DevTools Protocol session: ``ScriptDuration`` (seconds the page ran JavaScript) and
``TaskDuration``, and counts the updates the page received: requests for
``ipycloud/api/history`` (the status bar asks too, in every condition) and nvdashboard's
websocket messages. Conditions: ``idle`` (JupyterLab with the status bar, nothing else open),
``ipycloud`` (its machine chart view open), ``nvdashboard`` (its Machine Resources chart
open). A view's cost is its median per minute less the idle median.

Run: ``python benchmarks/chart_scripting.py [--nvdashboard-python PATH]`` (about 8 minutes
with nvdashboard); results go to ``benchmarks/results/chart_scripting.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from figures import machine, write_results

RESULTS = Path(__file__).parent / "results" / "chart_scripting.json"
BUILT_EXTENSION = Path(__file__).parent.parent / "ipycloud" / "labextension"
CHROMIUM = "/usr/bin/chromium"
WINDOW_S = 60.0
ROUNDS = 1  # each condition measured 2 x ROUNDS times (A B C C B A)
SETTLE_S = 5.0  # after opening a view, before measuring: its first load is paid once
REFRESH_S = 1
IPYCLOUD_PANEL = "ipycloud: GPU, CPU, RAM and kernels"  # the side panels' tab titles
NVDASHBOARD_PANEL = "GPU Dashboards"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def write_day_of_history(path: Path, now: float) -> int:
    """A day of readings before ``now`` in the server's history file, as the server thins
    them; returns how many."""
    times = [now - 86_400 + 60 * i for i in range(23 * 60)] + [now - 3600 + i for i in range(3600)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for i, stamp in enumerate(times):
            wave = (i % 600) / 600
            out.write(json.dumps({
                "time": stamp, "interval_s": 1.0,
                "platform": {"name": "Local machine", "session_left_s": None},
                "gpu_problem": "no GPU", "gpus": [],
                "cpu": {"percent": 100 * wave, "cores": 2, "throttled_percent": None},
                "ram": {"used": int(4e9 * wave), "limit": 8 * 2**30, "limited": True,
                        "peak": None, "swap_used": 0, "swap_total": 0},
                "disks": [{"name": "home", "path": "/root", "used": int(3e10 + 1e6 * i),
                           "total": 10**11}],
                "network": {"received_per_s": 1e5 * wave, "sent_per_s": 2e4 * wave}}) + "\n")
    return len(times)


def start_lab(home: Path, python: str, nvdashboard: bool) -> tuple[subprocess.Popen[bytes], str]:
    """``jupyter lab`` with its own folders under ``home`` and a day of history; returns it
    and its URL."""
    extensions = home / "jupyter-path" / "labextensions"
    extensions.mkdir(parents=True)
    (extensions / "ipycloud").symlink_to(BUILT_EXTENSION)
    servers = {"ipycloud.server": True, "jupyterlab_nvdashboard": nvdashboard}
    write_json(home / "config" / "jupyter_server_config.json",
               {"ServerApp": {"jpserver_extensions": servers}})
    settings = home / "settings"
    write_json(settings / "ipycloud" / "plugin.jupyterlab-settings",
               {"refreshInterval": REFRESH_S})
    write_json(settings / "jupyterlab-nvdashboard" / "config.jupyterlab-settings",
               {"updateFrequency": REFRESH_S * 1000})
    write_json(settings / "@jupyterlab/apputils-extension/notification.jupyterlab-settings",
               {"fetchNews": "false"})
    root = home / "root"
    root.mkdir()
    write_day_of_history(home / "history.jsonl", time.time())
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "JUPYTER_PATH": str(home / "jupyter-path"),
           "PYTHONPATH": str(Path(__file__).parent.parent)}
    log = (home / "jupyter.log").open("wb")
    process = subprocess.Popen(
        [python, "-m", "jupyterlab", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         "--ServerApp.open_browser=False", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
         "--IpycloudServer.interval=1",
         f"--IpycloudServer.history_file={home / 'history.jsonl'}",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                log_path = home / "jupyter.log"
                raise RuntimeError(f"jupyter lab did not start: see {log_path}") from None
            time.sleep(0.2)
    return process, f"{url}/lab?reset&token={token}"


def script_seconds(cdp: Any) -> dict[str, float]:
    metrics = cdp.send("Performance.getMetrics")["metrics"]
    return {entry["name"]: entry["value"] for entry in metrics
            if entry["name"] in ("ScriptDuration", "TaskDuration")}


def close_views(page: Any) -> None:
    """Close every tab of the main area."""
    for _ in range(5):
        tabs = page.locator("#jp-main-dock-panel .lm-TabBar-tabCloseIcon")
        if not tabs.count():
            return
        tabs.first.click()
        page.wait_for_timeout(300)


def open_view(page: Any, condition: str) -> None:
    close_views(page)
    # Each view is opened from its side panel, which is closed again: the panels' own
    # polling is not the chart's cost.
    if condition == "ipycloud":
        side_tab = page.locator(f'.jp-SideBar [title="{IPYCLOUD_PANEL}"]')
        side_tab.click()
        page.locator('[data-ipycloud-action="open-machine-chart"]').click()
        side_tab.click()
        page.locator('.ipycloud-ChartView [data-ipycloud-chart="cpu"] canvas').wait_for()
    elif condition == "nvdashboard":
        side_tab = page.locator(f'.jp-SideBar [title="{NVDASHBOARD_PANEL}"]')
        side_tab.click()
        page.get_by_role("button", name="Machine Resources").click()
        side_tab.click()
        page.locator("#jp-main-dock-panel .recharts-wrapper").first.wait_for()


def measure(url: str, conditions: list[str]) -> dict[str, list[dict[str, float]]]:
    from playwright.sync_api import sync_playwright

    windows: dict[str, list[dict[str, float]]] = {name: [] for name in conditions}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            page.locator("#ipycloud-status").wait_for(timeout=60_000)
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            updates = Counter[str]()
            page.on("request", lambda request: updates.update(
                ["history_requests"] if "/ipycloud/api/history" in request.url else []))
            page.on("websocket", lambda socket: socket.on(
                "framereceived", lambda _: updates.update(["nvdashboard_messages"])))
            order = [*conditions, *reversed(conditions)] * ROUNDS
            for condition in order:
                open_view(page, condition)
                page.wait_for_timeout(SETTLE_S * 1000)
                before = script_seconds(cdp)
                updates.clear()
                page.wait_for_timeout(WINDOW_S * 1000)
                after = script_seconds(cdp)
                per_minute = {name: round((after[name] - before[name]) * 60 / WINDOW_S * 1000, 1)
                              for name in after}
                per_minute.update({name: round(count * 60 / WINDOW_S)
                                   for name, count in updates.items()})
                windows[condition].append(per_minute)
                print(f"{condition}: {per_minute} ms per minute", flush=True)
            page.screenshot(path=str(Path(tempfile.gettempdir()) / "chart_scripting.png"))
        finally:
            browser.close()
    return windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvdashboard-python", help="a Python with jupyterlab_nvdashboard")
    args = parser.parse_args()
    python = args.nvdashboard_python or sys.executable
    conditions = ["idle", "ipycloud"] + (["nvdashboard"] if args.nvdashboard_python else [])
    with tempfile.TemporaryDirectory(prefix="chart-scripting-") as home:
        process, url = start_lab(Path(home), python, bool(args.nvdashboard_python))
        try:
            windows = measure(url, conditions)
        finally:
            process.terminate()
            process.wait(20)
    medians = {name: {metric: round(statistics.median(window.get(metric, 0) for window in each), 1)
                      for metric in ("ScriptDuration", "TaskDuration", "history_requests",
                                     "nvdashboard_messages")}
               for name, each in windows.items()}
    idle = medians["idle"]["ScriptDuration"]
    results = {
        "machine": machine(),
        "refresh_s": REFRESH_S, "window_s": WINDOW_S, "rounds": ROUNDS,
        "unit": "milliseconds of the page's main thread per minute; updates per minute",
        "history_readings_at_start": 23 * 60 + 3600,
        "median_per_minute": medians,
        "view_script_ms_per_minute": {name: round(each["ScriptDuration"] - idle, 1)
                                      for name, each in medians.items() if name != "idle"},
        "windows": windows,
    }
    write_results(RESULTS, results)
    print(json.dumps(results["view_script_ms_per_minute"]))


if __name__ == "__main__":
    main()
