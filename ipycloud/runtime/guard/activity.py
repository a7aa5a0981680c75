"""Activity pings: keep idle cullers from stopping a kernel that is quietly working.

**Kernel ping (every Jupyter server: JupyterHub, Paperspace, local JupyterLab).** The
server's kernel manager (``jupyter_server.services.kernels.kernelmanager``,
``start_watching_activity``) sets a kernel's ``last_activity``, and the server-wide figure
JupyterHub's culler reads, on every IOPub message from the kernel whose type is not in
``untracked_message_types``. Output (``stream``, ``display_data``), ``status`` and
``execute_result`` are untracked, so a long cell that prints progress still looks idle;
``comm_msg`` is tracked. So each ping is one ``comm_msg`` on IOPub to a comm id no frontend
has opened, with an empty parent header (it belongs to no cell). Frontends ignore it: the
kernel protocol says comm messages for an unknown comm are dropped, and JupyterLab's
``KernelConnection._handleCommMsg`` (@jupyterlab/services, also used by Notebook 7 and
VS Code) returns at once when the comm id is unknown; with no parent, no cell's output
handler sees it either. Nothing is displayed or stored in the notebook.

**Browser ping (Colab, best effort).** Colab decides idle disconnects in the browser, from
what the user does, so no kernel message can prevent them. The displayed JavaScript calls a
kernel callback every interval through ``google.colab.kernel.invokeFunction`` while the tab
is open; that is browser-initiated traffic, which may or may not count for Colab, whose
rules are not published. It cannot help once the tab is closed or the output cleared, and
while a cell runs the calls wait for it (``pings`` shows how many arrived).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any


class KernelActivity:
    """Marks the kernel active on its Jupyter server: one invisible comm message per ping."""

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel
        self.comm_id = f"ipycloud-keepalive-{uuid.uuid4().hex}"
        self._topic = f"comm-{self.comm_id}".encode("ascii")
        self.pings = 0

    def ping(self) -> None:
        """Send one ``comm_msg`` on IOPub (thread-safe: ipykernel's IOPub socket is)."""
        self.pings += 1
        content = {"comm_id": self.comm_id, "data": {"ipycloud": "keepalive", "ping": self.pings}}
        self._kernel.session.send(self._kernel.iopub_socket, "comm_msg", content, parent=None,
                                  ident=self._topic)


CALLBACK = "ipycloud.keepalive"

_SCRIPT = """\
(() => {
  // ipycloud keepalive: browser-side activity ping (best effort, see ipycloud docs).
  let waiting = false;
  const timer = setInterval(async () => {
    if (waiting) return;  // a running cell holds the call back; send no more meanwhile
    waiting = true;
    try {
      const reply = await google.colab.kernel.invokeFunction(%(callback)s, [%(token)s], {});
      if (!reply.data["application/json"].active) clearInterval(timer);
    } catch (error) {
      console.warn("ipycloud keepalive: browser ping failed", error);
    } finally {
      waiting = false;
    }
  }, %(every_ms)d);
})();
"""


class BrowserActivity:
    """Colab's browser-side ping: the JavaScript to display and the kernel callback it calls.

    Each instance has its own token; the callback answers ``active: false`` to any other
    token and after ``stop()``, which ends that script's timer.
    """

    def __init__(self, interval_s: float) -> None:
        from google.colab import output  # ImportError outside Colab

        self.interval_s = interval_s
        self.token = uuid.uuid4().hex
        self.pings = 0
        self.last_ping: float | None = None  # time.time() of the latest call from the browser
        self._active = threading.Event()
        self._active.set()
        output.register_callback(CALLBACK, self._on_ping)

    def script(self) -> str:
        """The JavaScript that calls back every interval while its output is shown."""
        return _SCRIPT % {"callback": json.dumps(CALLBACK), "token": json.dumps(self.token),
                          "every_ms": round(self.interval_s * 1000)}

    def stop(self) -> None:
        """Tell the script to stop at its next call."""
        self._active.clear()

    def _on_ping(self, token: str) -> _PingReply:
        current = token == self.token and self._active.is_set()
        if current:
            self.pings += 1
            self.last_ping = time.time()
        return _PingReply(current)


class _PingReply:
    """The callback's answer, which Colab sends back as ``application/json``."""

    def __init__(self, active: bool) -> None:
        self.data = {"active": active}

    def _repr_json_(self) -> dict[str, bool]:
        return self.data
