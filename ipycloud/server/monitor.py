"""The server's monitor: one sampler thread for every client, reading the machine with the
runtime's HostProbe into a ring buffer (the last minutes, as objects) and the kept history
(a day, as the route's JSON, across restarts), and the PIDs of the kernels it measures.

The probe is made, and the kept history read back, by the first reading (on the sampler
thread, or an executor's), so loading the extension reads no file. Handlers only read the
samples kept; before the first one exists they take one in an executor thread, never on the
event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from ipycloud.runtime.monitor.host import HostProbe, HostSample
from ipycloud.runtime.monitor.route_bodies import history_of_encoded, reading
from ipycloud.runtime.monitor.sampler import Sampler
from ipycloud.runtime.monitor.samples import Sample
from ipycloud.runtime.per_process import per_process
from ipycloud.runtime.untrusted import strict_dumps
from ipycloud.server.history import KeptHistory
from ipycloud.server.settings import IpycloudServer


class ServerMonitor:
    """The sampler and probe of one Jupyter server; ``watched`` maps kernel ids to the PIDs
    whose process trees each reading measures (set from the event loop)."""

    def __init__(self, settings: IpycloudServer, session_start: float) -> None:
        self.interval = settings.interval
        self._root = settings.system_root
        self._session_start = session_start
        self._probe: HostProbe | None = None
        self._probe_lock = threading.Lock()
        self.watched: Mapping[str, int] = {}
        self.sampler = Sampler(settings.interval, settings.capacity, probe=self._read)
        self.kept = KeptHistory(Path(settings.history_file) if settings.history_file else None,
                                settings.history)
        self._kept_opened = False

    def start(self) -> None:
        """Start the sampler thread; it samples until ``stop()``."""
        self.sampler.subscribe(_hold)

    def stop(self) -> None:
        """Stop the sampler thread and the history's file (what is kept stays readable)."""
        self.sampler.stop()
        self.kept.close()

    @property
    def running(self) -> bool:
        """Whether the sampler thread runs."""
        return self.sampler.running

    def probe(self) -> HostProbe:
        """The probe, made by its first use; call it off the event loop (it reads files)."""
        with self._probe_lock:
            if self._probe is None:
                self._probe = HostProbe(self._root, session_start=self._session_start)
            return self._probe

    def latest(self) -> HostSample | None:
        """The newest reading kept, if any."""
        return cast("HostSample | None", self.sampler.latest())

    async def current(self) -> HostSample:
        """The newest reading; before the first one exists, one taken now off the loop."""
        latest = self.latest()
        if latest is not None:
            return latest
        loop = asyncio.get_running_loop()
        return cast(HostSample, await loop.run_in_executor(None, self.sampler.sample_now))

    def history(self, since: float | None = None) -> list[HostSample]:
        """The readings of the last minutes (after ``since``, a Unix time), oldest first."""
        return cast("list[HostSample]", self.sampler.history(since))

    def history_json(self, since: float | None = None) -> str:
        """The body of the history route: the kept readings after ``since``."""
        return history_of_encoded(self.kept.since(since), self.interval)

    def _read(self) -> HostSample:
        """A reading, added to the kept history before the sampler holds it, so the history
        route has every reading the reading route gave."""
        sample = self.probe().read(self.watched)
        with self._probe_lock:
            if not self._kept_opened:
                self._kept_opened = True
                self.kept.open()
        self.kept.add(sample.time, strict_dumps(reading(sample, self.interval)))
        return sample


def _hold(sample: Sample) -> None:
    """The monitor's hold on the sampler, keeping its thread running: the readings are kept
    as they are taken, so nothing is done with each one as it comes."""


class _Current:
    """The monitor of this process's Jupyter server. Loading the extension again (a new
    server in the same process, as tests do) stops the previous monitor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._monitor: ServerMonitor | None = None

    def replace(self, monitor: ServerMonitor | None) -> None:
        with self._lock:
            previous, self._monitor = self._monitor, monitor
        if previous is not None:
            previous.stop()

    def stop(self) -> None:
        self.replace(None)


@per_process(close=_Current.stop)
def _current() -> _Current:
    return _Current()


def start_monitor(settings: IpycloudServer, session_start: float) -> ServerMonitor:
    """Start the monitor of this process's server, stopping any earlier one."""
    monitor = ServerMonitor(settings, session_start)
    _current().replace(monitor)
    monitor.start()
    return monitor
