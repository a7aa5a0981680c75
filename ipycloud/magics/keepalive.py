"""`%keepalive`: Keep the session alive and guard it against its deadline and preemption."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ipycloud.magics._arguments import (
    duration,
    durations,
    help_option,
    parse_line,
    refuse_options,
)
from ipycloud.magics._display import Notice

if TYPE_CHECKING:
    import argparse

    from IPython.display import DisplayHandle

    from ipycloud.runtime.guard.guard import GuardSettings, GuardStatus, SessionGuard

ACTIONS = ("start", "stop", "status")


@magics_class
class KeepaliveMagics(Magics):
    """Keep the session alive and guard it against its deadline and preemption."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._handle: DisplayHandle | None = None

    @help_option
    @magic_arguments()
    @argument("action", nargs="?", default="status", choices=ACTIONS, help="what to do")
    @argument("--interval", type=duration,
              help="time between activity pings: 60 (seconds), 90s, 5m (default 60s)")
    @argument("--limit", type=duration,
              help="session limit counted from the kernel's start: 12h, 90m (default: the "
                   "platform's)")
    @argument("--warn", type=durations,
              help="warn and run the deadline actions this long before the limit, "
                   "comma-separated (default 15m,5m)")
    @argument("--grace", type=duration,
              help="on SIGTERM, the longest wait for the deadline actions (default 25s)")
    @argument("--browser", action="store_true",
              help="add Colab's browser-side ping (best effort; on by default on Colab)")
    @argument("--no-browser", action="store_true", help="no browser-side ping, even on Colab")
    @line_magic
    def keepalive(self, line: str = "") -> Any:
        """Keep the session active, warn before its limit, and save work before it ends.

        ``start`` pings activity every interval so idle cullers (Jupyter server's
        ``cull_idle_timeout``, JupyterHub's idle culler, Paperspace) leave a long run
        alone: each ping is a comm message from the kernel that the server counts as
        activity and frontends ignore. On Colab, whose idle disconnect is decided in the
        browser, a displayed script also calls the kernel every interval while the tab is
        open (best effort: it cannot stand in for a closed tab).

        Before the session limit (the platform's, or ``--limit``; counted from the
        kernel's start) it warns at each ``--warn`` point and runs the deadline actions
        once per point: the ``%checkpoint auto`` objects are saved, then the registered
        actions run (e.g. the final run of ``%mount_storage sync --every``). On SIGTERM
        (preemption) it runs them too, waits at most ``--grace``, then lets the process
        end as it would have. Actions never overlap; failures are shown, not swallowed.
        Notices appear on stderr, in this magic's output and in ``%keepalive status``.

        Examples
        --------
        ::

            %checkpoint auto model optimizer --every 30m
            %keepalive start
            %keepalive start --interval 2m --limit 6h --warn 30m,10m --grace 20s
            %keepalive status
            %keepalive stop
        """
        args = parse_line(self.keepalive, line)
        if args.action == "start":
            return self._start(args)
        refuse_options(self.keepalive, args, set(), args.action)  # options belong to start
        if args.action == "stop":
            return self._stop()
        return self._status()

    def _start(self, args: argparse.Namespace) -> Any:
        from IPython.display import Javascript, display

        from ipycloud.runtime.kernel import running_kernel

        guard = self._guard()
        guard.notify = self._show
        try:
            guard.start(_settings(args))
        except ValueError as error:
            raise UsageError(f"%keepalive start: {error}") from None
        if guard.browser_script is not None:
            display(Javascript(guard.browser_script))
        if running_kernel() is None:
            return self._status()
        self._handle = display(self._status(), display_id=True)  # updated by each notice
        return None

    def _stop(self) -> Notice:
        guard = self._guard()
        if not guard.running:
            return Notice("keepalive was not running")
        guard.stop()
        self._handle = None
        return Notice("keepalive stopped: no more pings or warnings, SIGTERM handler restored")

    def _status(self) -> GuardStatus:
        """The shared guard's status, with this magic's own words for starting it."""
        return replace(self._guard().status(), start_hint="%keepalive start",
                       limit_hint="--limit")

    @staticmethod
    def _guard() -> SessionGuard:
        from ipycloud.runtime.guard.guard import session_guard

        return session_guard()

    def _show(self, text: str) -> None:
        """Show the guard's state in this magic's output (stderr already has ``text``)."""
        if self._handle is not None:
            self._handle.update(self._status())


def _settings(args: argparse.Namespace) -> GuardSettings:
    """The guard's settings from the magic's options."""
    from ipycloud.runtime.guard.guard import GuardSettings

    if args.browser and args.no_browser:
        raise UsageError("%keepalive start: give --browser or --no-browser, not both")
    given = {"interval_s": args.interval, "limit_s": args.limit, "grace_s": args.grace,
             "warnings_s": args.warn,
             "browser": bool(args.browser) if args.browser or args.no_browser else None}
    return GuardSettings(**{key: value for key, value in given.items() if value is not None})
