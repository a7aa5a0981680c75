"""The session guard: keep the session active, warn before its limit, save work before it ends.

``SessionGuard.start()`` runs one daemon thread that pings activity every interval
(``ipycloud.runtime.guard.activity``) and, at each warning point before the session limit, tells
the user and runs the deadline actions (``ipycloud.runtime.guard.deadline``) exactly once per
point. Elapsed time counts from the start of this process (the kernel). On SIGTERM it runs
the same actions, waits for them at most the grace period, then puts the previous SIGTERM
handler back and lets the signal take its course: a Python handler is called, the default
ends the process by the signal, an ignored SIGTERM stays ignored. The handler runs on the
main thread, which stays paused while a worker thread runs the actions, so the state they
save does not change under them (the signal may still land inside a training step). If the
main thread was itself saving the automatic checkpoint at that moment, the worker waits for
that save in vain until the grace period ends, and the previous checkpoint stands.

Notices come from background threads, whose output a notebook shows in the latest executed
cell, which may be long finished or off screen. So every notice is printed to stderr, passed
to ``notify`` (``%keepalive`` also updates its own output with it) and kept for ``status()``.
A warning point also sends a ``deadline`` alert to the configured URLs (``runtime.notify``).
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ipycloud.runtime.guard.deadline import register_action, run_or_join, unregister_action
from ipycloud.runtime.guard.settings import GuardSettings
from ipycloud.runtime.guard.status import GuardStatus
from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.notify import notify
from ipycloud.runtime.per_process import per_process
from ipycloud.runtime.units import format_seconds

if TYPE_CHECKING:
    from types import FrameType

    from ipycloud.runtime.guard.activity import BrowserActivity, KernelActivity
    from ipycloud.runtime.guard.deadline import ActionRun

__all__ = ["GuardSettings", "GuardStatus", "SessionGuard", "register_action",
           "session_guard", "unregister_action"]

_KEPT_NOTICES = 20


def process_start() -> float:
    """When this process (the kernel) started, as ``time.time()`` seconds."""
    import psutil

    return float(psutil.Process().create_time())


class SessionGuard:
    """Keeps the session active and runs the deadline actions before it ends.

    ``started_at`` is when the session's clock started (default: this process's start);
    ``notify`` is called with each notice's text from whichever thread noticed it.
    """

    def __init__(self, *, started_at: float | None = None,
                 notify: Callable[[str], object] | None = None) -> None:
        from ipycloud.runtime.machine.platform import detect_platform

        self.started_at = process_start() if started_at is None else started_at
        self.notify = notify
        self.platform = detect_platform()
        self.settings: GuardSettings | None = None  # None while stopped
        self._fired: set[float] = set()  # elapsed seconds of the warning points already handled
        self._lock = threading.RLock()  # re-entered by the SIGTERM handler on the main thread
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_ping = 0.0
        self._kernel: KernelActivity | None = None
        self._browser: BrowserActivity | None = None
        self._ping_error: str | None = None
        self._previous_sigterm: Any = None
        self._sigterm_installed = False
        self._terminating = False
        self.notices: deque[str] = deque(maxlen=_KEPT_NOTICES)
        # Colab's browser-side ping, to be displayed as JavaScript by the front; None: none
        self.browser_script: str | None = None

    # -- control ------------------------------------------------------------------------------

    def start(self, settings: GuardSettings | None = None) -> None:
        """Start guarding, or replace the settings of the running guard (same thread).

        From the main thread it also handles SIGTERM; elsewhere it cannot. On Colab the
        browser-side ping works once the front displays ``browser_script`` as JavaScript.
        """
        settings = settings or GuardSettings()
        limit, _ = self._resolve_limit(settings)
        if limit is not None:
            settings.check_limit(limit)
        browser = self._browser_activity(settings)
        with self._lock:
            if self._browser is not None:
                self._browser.stop()
            self.settings, self._browser = settings, browser
            self.browser_script = None if browser is None else browser.script()
            self._next_ping = 0.0
            if self._kernel is None:
                self._kernel = _kernel_activity()
            if threading.current_thread() is threading.main_thread():
                self._install_sigterm()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="ipycloud-keepalive",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and the browser ping, and put the previous SIGTERM handler back."""
        on_main = threading.current_thread() is threading.main_thread()
        if self._sigterm_installed and not on_main:
            raise RuntimeError("stop the session guard from the main thread: only it can put "
                               "the previous SIGTERM handler back")
        with self._lock:
            self.settings = None
            thread, self._thread = self._thread, None
            if self._browser is not None:
                self._browser.stop()
                self._browser = None
                self.browser_script = None
            self._restore_sigterm()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the guard is started."""
        return self.settings is not None

    def elapsed(self) -> float:
        """Seconds since the session's clock started."""
        return time.time() - self.started_at

    def run_actions(self, reason: str) -> ActionRun:
        """Run the deadline actions now (or join the run in progress) and report how it went."""
        run, joined = run_or_join(reason)
        prefix = f"{reason}: joined the run already in progress; " if joined else ""
        self._notice(prefix + run.describe())
        return run

    def status(self) -> GuardStatus:
        """Elapsed time, the limit, time left, the next warning, pings, actions and notices."""
        from ipycloud.runtime.guard.deadline import last_run, registered_actions

        with self._lock:
            settings = self.settings or GuardSettings()
            limit, source = self._resolve_limit(settings)
            run = last_run()
            return GuardStatus(
                running=self.running, platform=self.platform.name, elapsed_s=self.elapsed(),
                limit_s=limit, limit_source=source,
                next_warning_s=self._next_point(settings, limit), warnings_s=settings.warnings_s,
                interval_s=settings.interval_s if self.running else None,
                kernel_pings=None if self._kernel is None else self._kernel.pings,
                browser_pings=None if self._browser is None else self._browser.pings,
                browser_last_ping=None if self._browser is None else self._browser.last_ping,
                sigterm=self._sigterm_state(settings), actions=tuple(registered_actions()),
                last_run=None if run is None else run.describe(), notices=tuple(self.notices))

    def __repr__(self) -> str:
        """The guard in words: ``SessionGuard(running, a ping every 1 min; limit 12 h (Google
        Colab's limit), reached at 21:40; next warning at 21:25; deadline actions: checkpoint
        auto; SIGTERM guarded)``."""
        status = self.status()
        parts = [f"running, a ping every {format_seconds(status.interval_s)}"
                 if status.running and status.interval_s is not None else "stopped"]
        if status.limit_s is None:
            parts.append(status.limit_source)
        else:
            parts.append(f"limit {format_seconds(status.limit_s)} ({status.limit_source}), "
                         f"reached at {_clock(self.started_at + status.limit_s)}")
            if status.running and status.next_warning_s is not None:
                parts.append(f"next warning at {_clock(self.started_at + status.next_warning_s)}")
        parts.append(f"deadline actions: {', '.join(status.actions) or 'none'}")
        if status.running:
            parts.append(f"SIGTERM {'guarded' if self._sigterm_installed else 'not guarded'}")
        return f"SessionGuard({'; '.join(parts)})"

    # -- the thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._wake.clear()
                settings = self.settings
                if settings is None or self._thread is not threading.current_thread():
                    return
                limit, source = self._resolve_limit(settings)
                now = time.monotonic()
                ping = now >= self._next_ping
                if ping:
                    self._next_ping = now + settings.interval_s
                due = self._take_due_points(settings, limit)
                point = self._next_point(settings, limit)
                wait = self._next_ping - now
            if ping:
                self._ping()
            if due and limit is not None:
                self._warn(limit, source)
            if point is not None:
                wait = min(wait, point - self.elapsed())
            self._wake.wait(max(0.0, wait))

    def _ping(self) -> None:
        try:
            if self._kernel is not None:
                self._kernel.ping()
            error = None
        except Exception as failure:  # reported once per distinct error, the thread goes on
            error = f"activity ping failed: {describe_error(failure)}"
        if error != self._ping_error and error is not None:
            self._notice(error)
        self._ping_error = error

    def _take_due_points(self, settings: GuardSettings, limit: float | None) -> bool:
        """Mark the warning points reached and not yet handled as handled; whether any were."""
        if limit is None:
            return False
        elapsed = self.elapsed()
        due = {limit - warning for warning in settings.warnings_s
               if limit - warning <= elapsed} - self._fired
        self._fired |= due
        return bool(due)

    def _warn(self, limit: float, source: str) -> None:
        """Tell the user, then run the deadline actions on a thread of their own.

        The pings go on meanwhile; several points reached at once make one run.
        """
        left = limit - self.elapsed()
        reason = (f"{format_seconds(left)} left before the session limit" if left > 0
                  else "the session limit has passed")
        self._notice(f"{reason} ({format_seconds(limit)}, {source}): running the deadline "
                     "actions now")
        notify("deadline", "ipycloud: the session ends soon",
               f"{reason} ({format_seconds(limit)}, {source}) on {socket.gethostname()}: "
               "running the deadline actions (checkpoint, sync) now")
        threading.Thread(target=self.run_actions, args=(reason,), daemon=True,
                         name="ipycloud-deadline-actions").start()

    def _next_point(self, settings: GuardSettings, limit: float | None) -> float | None:
        """Elapsed seconds of the next warning point not yet handled, if any."""
        if limit is None:
            return None
        points = [limit - warning for warning in settings.warnings_s
                  if limit - warning not in self._fired]
        return min(points, default=None)

    def _notice(self, text: str) -> None:
        self.notices.append(f"{time.strftime('%H:%M:%S')} {text}")
        print(f"ipycloud keepalive: {text}", file=sys.stderr, flush=True)
        if self.notify is not None:
            try:
                self.notify(text)
            except Exception as error:  # a broken notifier must not stop the guard
                self.notices.append(f"notify failed: {describe_error(error)}")

    # -- SIGTERM ------------------------------------------------------------------------------

    def _install_sigterm(self) -> None:
        if not self._sigterm_installed:
            self._previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True

    def _restore_sigterm(self) -> None:
        if not self._sigterm_installed:
            return
        self._sigterm_installed = False
        if signal.getsignal(signal.SIGTERM) != self._on_sigterm:
            self._notice("another SIGTERM handler replaced the guard's; it is left in place")
            return
        previous = self._previous_sigterm  # None: set outside Python, taken as the default
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._terminating:  # a repeated SIGTERM during the grace period
            return
        self._terminating = True
        grace = (self.settings or GuardSettings()).grace_s
        self._notice(f"SIGTERM: running the deadline actions (waiting at most "
                     f"{format_seconds(grace)}), then the process ends")
        worker = threading.Thread(target=self.run_actions, args=("SIGTERM",), daemon=True,
                                  name="ipycloud-sigterm-actions")
        worker.start()
        worker.join(grace)
        if worker.is_alive():
            self._notice(f"the deadline actions did not finish within {format_seconds(grace)}; "
                         "ending anyway")
        previous = self._previous_sigterm
        self.stop(timeout=1.0)
        self._terminating = False
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            self._notice("SIGTERM was ignored before the guard started, so the process goes on")
        else:
            signal.raise_signal(signum)

    def _sigterm_state(self, settings: GuardSettings) -> str:
        if self._sigterm_installed:
            return (f"guarded: deadline actions, then the process ends (grace "
                    f"{format_seconds(settings.grace_s)})")
        return ("not guarded: start from the main thread to handle it" if self.running
                else "not guarded")

    # -- helpers ------------------------------------------------------------------------------

    def _resolve_limit(self, settings: GuardSettings) -> tuple[float | None, str]:
        if settings.limit_s is not None:
            return settings.limit_s, "as given"
        if self.platform.session_limit_s is not None:
            return float(self.platform.session_limit_s), f"{self.platform.name}'s limit"
        return None, f"no limit known for {self.platform.name}"

    def _browser_activity(self, settings: GuardSettings) -> BrowserActivity | None:
        wanted = self.platform.key == "colab" if settings.browser is None else settings.browser
        if not wanted:
            return None
        from ipycloud.runtime.guard.activity import BrowserActivity

        try:
            return BrowserActivity(settings.interval_s)
        except ImportError:
            if settings.browser:
                raise ValueError("the browser ping works only on Colab, where idle disconnects "
                                 "are decided in the browser; elsewhere the kernel ping keeps "
                                 "the Jupyter server active") from None
            return None


@per_process(close=SessionGuard.stop)
def session_guard() -> SessionGuard:
    """The session guard of this process, shared by every front (made stopped)."""
    return SessionGuard()


def _clock(unix_time: float) -> str:
    """Local clock time, ``21:40``, with the date when it is not today."""
    moment = time.localtime(unix_time)
    today = time.localtime()[:3] == moment[:3]
    return time.strftime("%H:%M" if today else "%Y-%m-%d %H:%M", moment)


def _kernel_activity() -> KernelActivity | None:
    from ipycloud.runtime.guard.activity import KernelActivity
    from ipycloud.runtime.kernel import running_kernel

    kernel = running_kernel()
    return None if kernel is None else KernelActivity(kernel)
