"""Loading the extension into a Jupyter server: settings, monitor, kernel watch, runs,
routes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from ipycloud.server.events import DeathRecorder
from ipycloud.server.handlers import Services
from ipycloud.server.kernels import KernelWatch
from ipycloud.server.monitor import start_monitor
from ipycloud.server.routes import API_PATH, add_routes
from ipycloud.server.runs import RunFinder
from ipycloud.server.settings import IpycloudServer


def load(serverapp: Any) -> None:
    """Start the monitor of ``serverapp`` and serve its routes."""
    settings = IpycloudServer(parent=serverapp)
    # The platform's session limit counts from the server's start: on Colab or Kaggle the
    # server starts with the machine.
    monitor = start_monitor(settings, session_start=psutil.Process().create_time())
    events = DeathRecorder(monitor)
    gateway = bool(getattr(getattr(serverapp, "gateway_config", None), "gateway_enabled", False))
    kernels = KernelWatch(serverapp.kernel_manager, serverapp.session_manager, monitor, events,
                          gateway)
    kernels.start(serverapp.io_loop)
    runs = RunFinder(Path(serverapp.root_dir).expanduser())
    add_routes(serverapp.web_app, Services(monitor, kernels, events, runs))
    serverapp.log.info("ipycloud: machine readings every %g s under %s%s/", settings.interval,
                       serverapp.web_app.settings["base_url"], API_PATH)
