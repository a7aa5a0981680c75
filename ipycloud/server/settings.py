"""The extension's settings, as traits of the server's configuration.

In ``jupyter_server_config.py``: ``c.IpycloudServer.interval = 2.0``; on the command line:
``--IpycloudServer.interval=2``. The interval and history also have environment defaults.
The machine's history is kept in ipycloud's state folder: ``$IPYCLOUD_STATE_DIR``, else
platformdirs' user state folder (``~/.local/state/ipycloud`` on Linux).
"""

from __future__ import annotations

import math
import os
from typing import Any

from traitlets import Float, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from ipycloud.runtime.monitor.sampler import MAX_INTERVAL_S, VIEW_MIN_INTERVAL_S
from ipycloud.runtime.runs.records import state_dir

MAX_HISTORY_S = 86400.0
# The readings kept as objects, for explaining a kernel's death: the last ten minutes.
RECENT_S = 600.0


class IpycloudServer(Configurable):
    """How the server's monitor samples the machine."""

    interval = Float(
        1.0, help="Seconds between two readings of the machine by the server's one sampler "
        f"thread, from {VIEW_MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} "
        "(environment: IPYCLOUD_SERVER_INTERVAL).").tag(config=True)
    history = Float(
        MAX_HISTORY_S, help="Seconds of readings kept for the history route, above 0 and at "
        f"most {MAX_HISTORY_S:g}; one a minute beyond the last hour "
        "(environment: IPYCLOUD_SERVER_HISTORY).").tag(config=True)
    history_file = Unicode(
        help="The file keeping the history across the server's restarts (JSON lines); empty: "
        "kept in memory only. Default: server-history.jsonl in ipycloud's state folder "
        "($IPYCLOUD_STATE_DIR, else ~/.local/state/ipycloud).").tag(config=True)
    system_root = Unicode(
        "/", help="The folder under which /proc/self/cgroup, /sys/fs/cgroup and the platform's "
        "marker files are read; another folder holds a fake tree for tests.").tag(config=True)

    @default("interval")
    def _interval_default(self) -> float:
        return _environment_seconds("IPYCLOUD_SERVER_INTERVAL", 1.0)

    @default("history")
    def _history_default(self) -> float:
        return _environment_seconds("IPYCLOUD_SERVER_HISTORY", MAX_HISTORY_S)

    @default("history_file")
    def _history_file_default(self) -> str:
        return str(state_dir() / "server-history.jsonl")

    @validate("interval")
    def _check_interval(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not (math.isfinite(value) and VIEW_MIN_INTERVAL_S <= value <= MAX_INTERVAL_S):
            raise TraitError(f"IpycloudServer.interval must be from {VIEW_MIN_INTERVAL_S:g} to "
                             f"{MAX_INTERVAL_S:g} seconds, not {value!r}")
        return value

    @validate("history")
    def _check_history(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not (math.isfinite(value) and 0 < value <= MAX_HISTORY_S):
            raise TraitError(f"IpycloudServer.history must be above 0 and at most "
                             f"{MAX_HISTORY_S:g} seconds, not {value!r}")
        return value

    @property
    def capacity(self) -> int:
        """How many readings the sampler keeps as objects (the last RECENT_S seconds of the
        history): at least one."""
        return max(math.ceil(min(self.history, RECENT_S) / self.interval), 1)


def _environment_seconds(name: str, fallback: float) -> float:
    """A number of seconds from the environment variable ``name``, else ``fallback``."""
    text = os.environ.get(name)
    if text is None:
        return fallback
    try:
        return float(text)
    except ValueError:
        raise TraitError(f"{name} must be a number of seconds, not {text!r}") from None
