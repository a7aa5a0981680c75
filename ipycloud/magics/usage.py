"""Usage recording from ``%load_ext ipycloud`` on, so that the usage report covers the session."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, observe
from traitlets.config import Configurable


class UsageRecording(Configurable):
    """Records the session's resource use for ``%dashboard report`` and
    ``ipycloud.usage_report()``: the shared background sampler, once a second, started when
    the extension loads. Turn it off in an IPython config file with
    ``c.UsageRecording.enabled = False``, or now with ``%config UsageRecording.enabled = False``.
    """

    enabled = Bool(True, help="Record CPU, RAM and GPU use from %load_ext ipycloud on (one "
                              "sample a second on a background thread); False: only while a "
                              "dashboard runs or after "
                              "ipycloud.runtime.monitor.session.start_monitoring()"
                   ).tag(config=True)

    def __init__(self, shell: Any, **kwargs: Any) -> None:
        super().__init__(parent=shell, **kwargs)
        shell.configurables.append(self)  # %config lists it and changes it
        if self.enabled:
            self._record(True)

    @observe("enabled")
    def _enabled_changed(self, change: dict[str, Any]) -> None:
        self._record(change["new"])

    @staticmethod
    def _record(on: bool) -> None:
        from ipycloud.runtime.monitor.session import start_monitoring, stop_monitoring

        if on:
            start_monitoring()
        else:
            stop_monitoring()
