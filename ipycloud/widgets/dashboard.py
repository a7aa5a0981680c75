"""The live resource panel: a row per GPU, CPU, RAM and disk, fed by the shared sampler.

Every dashboard is one subscription to a sampler, so any number of them share its one
thread. The panel's widgets are all built when the dashboard is made, from one reading
taken then; the sampler thread afterwards only sets traits of those widgets (never
displays, never creates a widget), and only traits whose value changed.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from ipycloud.runtime.messages import one_line
from ipycloud.runtime.monitor.readings import Reading, readings
from ipycloud.runtime.monitor.sampler import DEFAULT_INTERVAL_S, VIEW_HISTORY_S, check_view_pace
from ipycloud.runtime.units import format_duration
from ipycloud.widgets.rows import RowWidgets, set_changed
from ipycloud.widgets.sparkline import Trace
from ipycloud.widgets.stills import Stills

if TYPE_CHECKING:
    from ipycloud.runtime.monitor.sampler import Sampler, Subscription
    from ipycloud.runtime.monitor.samples import Sample


class Dashboard:
    """A live panel of the machine's resources; display it (it is a widget) and ``start()``.

    Once stopped, the outputs it was displayed in show a snapshot of the dashboard instead
    of the widget, which a notebook saved later keeps (its widget model is gone by then).
    """

    def __init__(self, sampler: Sampler, *, interval: float = DEFAULT_INTERVAL_S,
                 history: float = VIEW_HISTORY_S) -> None:
        check_view_pace(interval, history)
        self.sampler = sampler
        self.interval = interval
        self.history = history
        first = sampler.sample_now()
        self._traces: dict[str, Trace] = {}
        self.rows: dict[str, RowWidgets] = {}
        for reading in readings(first):
            self.rows[reading.key] = RowWidgets(reading)
            if reading.traced:
                self._traces[reading.key] = Trace(history, len(reading.gauges))
        for past in sampler.history(since=first.time - history):
            self._record(past)
        self._lock = threading.Lock()
        self._subscription: Subscription | None = None
        self._stills = Stills()
        self.status = widgets.Label("not started")
        self.stop_button = widgets.Button(description="Stop", icon="stop",
                                          tooltip="stop updating this dashboard")
        self.stop_button.on_click(lambda _button: self.stop())
        header = widgets.HBox([widgets.HTML("<b>ipycloud</b>"), self.status, self.stop_button])
        self.widget = widgets.VBox([header, *(row.box for row in self.rows.values())])
        self.update(first)

    @property
    def cpu_bar(self) -> Any:
        """The CPU row's bar (a ``FloatProgress``, 0-100)."""
        return self.rows["cpu"].bars[0]

    @property
    def ram_bar(self) -> Any:
        """The RAM row's bar (a ``FloatProgress``, 0-100)."""
        return self.rows["ram"].bars[0]

    @property
    def active(self) -> bool:
        """Whether the panel is updating."""
        return self._subscription is not None and self._subscription.active

    def start(self) -> Dashboard:
        """Subscribe to the sampler (starting its thread if needed); harmless when active."""
        with self._lock:
            if not self.active:
                self._subscription = self.sampler.subscribe(self.update, interval=self.interval)
                set_changed(self.stop_button, disabled=False)
                set_changed(self.status, value=f"live, every {self.interval:g} s; history "
                                               f"{format_duration(self.history)}")
        return self

    def stop(self, why: str = "stopped") -> None:
        """Cancel this panel's subscription (others on the sampler go on) and say ``why``."""
        with self._lock:
            if self._subscription is not None:
                self._subscription.cancel()
            set_changed(self.stop_button, disabled=True)
            set_changed(self.status, value=why)
        self._stills.freeze(self.sampler, f"the live panel {why}")

    def update(self, sample: Sample) -> None:
        """Show ``sample`` (the subscription's callback, run on the sampler thread at the
        dashboard's own interval)."""
        try:
            for reading in self._record(sample):
                row = self.rows.get(reading.key)
                trace = self._traces.get(reading.key)
                if row is not None:  # a GPU or disk that appeared later has no row
                    row.show(reading, trace.svg(_title(reading, self.history)) if trace else None)
        except Exception as error:
            set_changed(self.status, value=f"stopped by an error: {one_line(error)}")
            raise  # the sampler removes this subscription and reports it

    def _record(self, sample: Sample) -> list[Reading]:
        """The sample's readings, added to the sparklines' traces."""
        rows = readings(sample)
        for reading in rows:
            trace = self._traces.get(reading.key)
            if trace is not None:
                trace.add(sample.time, [gauge.percent for gauge in reading.gauges])
        return rows

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The panel where widgets render; elsewhere (a terminal) one line saying what it is."""
        return {**self.widget._repr_mimebundle_(**kwargs), "text/plain": repr(self)}

    def _ipython_display_(self) -> None:
        self._stills.show(self._repr_mimebundle_())

    def __repr__(self) -> str:
        state = "live" if self.active else "stopped"
        return f"<Dashboard {state}, every {self.interval:g} s, rows {', '.join(self.rows)}>"


def live_dashboard(interval: float = DEFAULT_INTERVAL_S,
                   history: float = VIEW_HISTORY_S) -> Dashboard:
    """Start session monitoring and a dashboard on its sampler; display the result."""
    from ipycloud.runtime.monitor.session import start_monitoring

    check_view_pace(interval, history)  # before monitoring starts: a mistake changes nothing
    return Dashboard(start_monitoring(), interval=interval, history=history).start()


def _title(reading: Reading, history: float) -> str:
    names = " (blue) and ".join(gauge.name for gauge in reading.gauges)
    suffix = " (orange)" if len(reading.gauges) > 1 else ""
    return f"{reading.label}: {names}{suffix}, last {format_duration(history)}"
