"""`%dashboard`: Live resource dashboards, per-cell resource use and the usage report."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ipycloud.magics._arguments import (
    duration,
    help_option,
    parse_line,
    refuse_options,
    user_path,
)
from ipycloud.magics._display import Notice
from ipycloud.magics._storage_errors import storage_problem

if TYPE_CHECKING:
    import argparse

    from ipycloud.magics.dashboard_web import PageView
    from ipycloud.runtime.monitor.cells import CellRecorder
    from ipycloud.widgets.dashboard import Dashboard

ACTIONS = ("cells", "report", "stop")
# The options each use of the magic takes ("live": no action word); any other is refused.
OPTIONS = {
    "live": {"interval", "history", "text", "cells", "web"},
    "cells": set(),
    "report": {"json", "csv", "instance"},
    "stop": set(),
}
NO_SAMPLES = ("no samples recorded yet: start monitoring with %dashboard "
              "(or ipycloud.runtime.monitor.session.start_monitoring())")


@magics_class
class DashboardMagics(Magics):
    """Live resource dashboards, per-cell resource use and the usage report."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._dashboards: list[Dashboard] = []
        self._pages: list[PageView] = []
        self._recorder: CellRecorder | None = None

    @help_option
    @magic_arguments()
    @argument("action", nargs="?", choices=ACTIONS,
              help="cells: the per-cell table; report: the usage and cost report; stop: stop "
                   "this notebook's dashboards and recording (none: a live dashboard)")
    @argument("--interval", type=duration, help="seconds between updates (default 1)")
    @argument("--history", type=duration,
              help="how far back the sparklines reach, e.g. 90s, 10m (default 5m)")
    @argument("--text", action="store_true",
              help="print one reading as text instead (no ipywidgets needed)")
    @argument("--web", action="store_true",
              help="the page the kernel serves itself, in an iframe: live while cells run "
                   "(the default on Colab)")
    @argument("--cells", action="store_true",
              help="also record each cell's wall time, peak RAM and peak GPU memory")
    @argument("--json", action="store_true", help="report: as JSON")
    @argument("--csv", metavar="FILE", type=user_path, help="report: write it to FILE as CSV")
    @argument("--instance", metavar="KEY",
              help="report: price the run as this instance of the price table")
    @line_magic
    def dashboard(self, line: str = "") -> Any:
        """Watch the GPUs, CPU, RAM and disks live, per cell, and as a usage and cost report.

        The live panel has a row per GPU (utilisation and memory bars, temperature, power
        and a sparkline), one for the CPU, one for RAM against the container's limit and
        one per disk. Memory and disk bars turn amber from 80% of their limit and red from
        90%. The panel updates from one background thread shared by every dashboard, even
        while other cells run; its Stop button (or ``%dashboard stop``) ends it. A click
        while a cell runs takes effect when the cell ends. Starting a dashboard also starts
        session monitoring, which ``%dashboard report`` totals.

        ``--web`` shows the same figures as a page, in an iframe, with the run of
        ``ipycloud.fit`` in this kernel (step of total, ETA against the session's time left,
        loss, learning rate and validation curves): it needs no widgets and keeps updating
        while a cell runs. Where a Jupyter server with ipycloud's extension started the
        kernel (JupyterLab, JupyterHub, Binder), that server serves the page under its own
        login, so a browser on another machine sees it; elsewhere the kernel serves it
        itself on a loopback port behind a random token, which only a browser on the
        kernel's machine reaches. On Colab, which does not draw widget updates sent while a
        cell runs, plain ``%dashboard`` shows the kernel's page through Colab's kernel-port
        iframe. In a terminal ``--web`` prints the page's address.

        A notebook saved with a live view keeps a snapshot of the dashboard (tables of the
        runs and resources): beside the page's iframe, shown where the iframe is not (an
        untrusted notebook); and in place of the page or the panel once it stops (its Stop
        button, or ``%dashboard stop``).

        Examples
        --------
        A live panel, updated every second, with sparklines of the last 5 minutes::

            %dashboard
            %dashboard --interval 0.5 --history 10m

        The page the kernel serves, live even while a training cell runs::

            %dashboard --web

        Without ipywidgets (or in a terminal), one reading as text::

            %dashboard --text

        Record what each cell uses, then show the table::

            %dashboard --cells
            %dashboard cells

        The usage and cost report of the session, priced as another instance, or saved::

            %dashboard report
            %dashboard report --instance aws:g5.xlarge
            %dashboard report --json
            %dashboard report --csv usage.csv

        Stop every dashboard of this notebook, the page's server (its port closes) and the
        per-cell recording::

            %dashboard stop
        """
        args = parse_line(self.dashboard, line)
        from ipycloud.runtime.messages import one_line

        use = args.action or "live"
        refuse_options(self.dashboard, args, OPTIONS[use],
                       "a live dashboard" if use == "live" else use)
        actions = {"live": self._live, "cells": self._cells, "report": self._report,
                   "stop": self._stop}
        try:
            return actions[use](args)
        except (ValueError, OSError) as error:
            raise UsageError(f"%dashboard{'' if use == 'live' else ' ' + use}: "
                             f"{one_line(error)}") from None

    def _live(self, args: argparse.Namespace) -> Any:
        from ipycloud.runtime.monitor.sampler import DEFAULT_INTERVAL_S, VIEW_HISTORY_S

        if args.text:
            if args.interval or args.history:
                raise ValueError("--interval and --history are for the live panel, not --text")
            if args.web:
                raise ValueError("--web and --text do not go together: pick one")
            return self._text(args.cells)
        from ipycloud.magics.dashboard_web import on_colab, show_page

        interval = args.interval or DEFAULT_INTERVAL_S
        history = args.history or VIEW_HISTORY_S
        view: Any
        if args.web or on_colab():
            view = show_page(interval, history)
            if view is not None:
                self._pages.append(view)
        else:
            view = self._panel(interval, history)
        if args.cells:
            self._record_cells()
        return view

    def _panel(self, interval: float, history: float) -> Dashboard:
        """The live ipywidgets panel."""
        from ipycloud.runtime._optional import require

        if _in_terminal(self.shell):
            raise UsageError("%dashboard: a terminal cannot show the live panel; use "
                             "%dashboard --text for a reading as text")
        try:
            require("ipywidgets", "widgets")
        except ImportError as error:
            raise UsageError(f"%dashboard: {error}; or run %dashboard --text for a one-shot "
                             "text view (%dashboard --text --cells also records each cell)"
                             ) from None
        from ipycloud.widgets.dashboard import live_dashboard

        dashboard = live_dashboard(interval, history)
        self._dashboards.append(dashboard)
        return dashboard

    def _text(self, cells: bool) -> Notice:
        from ipycloud.runtime.monitor.sampler import shared_sampler
        from ipycloud.runtime.monitor.textview import text_view

        live = "%dashboard in a notebook" if _in_terminal(self.shell) else "%dashboard"
        text = text_view(shared_sampler().sample_now(), live_hint=live)
        if cells:
            self._record_cells()
            text += "\nrecording each cell's resource use: %dashboard cells shows the table"
        return Notice(text)

    def _record_cells(self) -> None:
        from ipycloud.runtime.monitor.cells import CellRecorder
        from ipycloud.runtime.monitor.session import start_monitoring

        if self._recorder is None:
            self._recorder = CellRecorder(self.shell, start_monitoring())
        self._recorder.start()

    def _cells(self, args: argparse.Namespace) -> Any:
        start = self._start_recording()
        if self._recorder is None:
            raise ValueError(f"no cells recorded: start recording with {start}")
        return self._recorder.table(start_hint=start)

    def _start_recording(self) -> str:
        """The line that starts recording cells here: ``%dashboard --cells`` where the live
        view shows (ipywidgets, or Colab's page), else ``%dashboard --text --cells``."""
        from ipycloud.magics.dashboard_web import on_colab
        from ipycloud.runtime._optional import is_available

        live = on_colab() or (is_available("ipywidgets") and not _in_terminal(self.shell))
        return "%dashboard --cells" if live else "%dashboard --text --cells"

    def _report(self, args: argparse.Namespace) -> Any:
        from ipycloud.runtime.machine.report import JsonReport
        from ipycloud.runtime.monitor.usage import NoSamplesError, usage_report

        if args.json and args.csv:
            raise ValueError("--json and --csv do not go together: pick one")
        try:
            report = replace(usage_report(instance=args.instance),
                             instance_option="--instance KEY")
        except NoSamplesError:
            raise ValueError(NO_SAMPLES) from None
        if args.csv:
            try:
                report.to_csv(args.csv)
            except OSError as error:
                problem = storage_problem(args.csv, error, "--csv")
                raise UsageError(f"%dashboard report: {problem}") from None
            return Notice(f"wrote the usage report to {args.csv}")
        return JsonReport(report) if args.json else report

    def _stop(self, args: argparse.Namespace) -> Notice:
        """Stop the dashboards and per-cell recording; usage recording goes on if it is on."""
        from ipycloud.runtime.monitor.sampler import shared_sampler
        from ipycloud.runtime.monitor.session import start_monitoring, stop_monitoring
        from ipycloud.runtime.monitor.webpage import stop_page
        from ipycloud.runtime.units import counted

        live = [dashboard for dashboard in self._dashboards if dashboard.active]
        for dashboard in self._dashboards:
            dashboard.stop()
        self._dashboards.clear()
        for view in self._pages:
            view.end()
        self._pages.clear()
        page = stop_page()
        recording = self._recorder is not None and self._recorder.recording
        if self._recorder is not None:
            self._recorder.stop()
        usage_on = _usage_recording_on(self.shell)
        if usage_on:
            start_monitoring()  # back to its own pace, from the dashboard's
        else:
            stop_monitoring()
        done = [counted(len(live), "dashboard")]
        if page is not None:
            done.append(f"the dashboard page (port {page.port} closed)")
        if recording:
            done.append("per-cell recording (%dashboard cells still shows the table)")
        stopped = f"stopped {_listed(done)}"
        if usage_on:
            return Notice(f"{stopped}; usage recording goes on once a second "
                          "(%config UsageRecording.enabled = False stops it)")
        others = shared_sampler().subscribers
        sampler = ("the background sampler has stopped" if others == 0 else
                   f"the background sampler keeps running for {counted(others, 'other user')}")
        return Notice(f"{stopped}; {sampler}")


def _listed(parts: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(filter(None, (", ".join(parts[:-1]), parts[-1])))


def _usage_recording_on(shell: Any) -> bool:
    """Whether the session's usage recording (``UsageRecording.enabled``) is on."""
    from ipycloud.magics.usage import UsageRecording

    return any(isinstance(configurable, UsageRecording) and configurable.enabled
               for configurable in getattr(shell, "configurables", ()))


def _in_terminal(shell: Any) -> bool:
    """Whether ``shell`` is IPython's terminal, which has no frontend to show widgets in."""
    terminal = sys.modules.get("IPython.terminal.interactiveshell")  # loaded if it is one
    return terminal is not None and isinstance(shell, terminal.TerminalInteractiveShell)
