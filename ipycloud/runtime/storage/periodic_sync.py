"""Sync a folder to persistent storage every few minutes, in a background thread."""

from __future__ import annotations

import atexit
import logging
import threading
import time
from pathlib import Path
from typing import Any

from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.per_process import per_process
from ipycloud.runtime.storage.failed_syncs import report_at_exit
from ipycloud.runtime.storage.sync import PathArg, SyncReport, check_pair, sync
from ipycloud.runtime.units import format_seconds

__all__ = ["BackgroundSync", "background_sync_of", "running_syncs"]

_log = logging.getLogger(__name__)


class BackgroundSync:
    """Sync ``src`` to ``dst`` every ``every_s`` seconds in a daemon thread.

    One runs per (source, destination) pair: starting one stops the one of its pair
    that was running, which it keeps in ``replaced``.
    A final sync runs at ``stop()``, at interpreter exit, and as a deadline action of the
    session guard (before the session limit and on SIGTERM) while it runs: every running
    one is listed by ``running_syncs()``.
    An error in the background is logged and kept in ``last_error``; it is named in the
    words of ``str()`` (after a later run that worked too) until ``stop()`` raises it.
    Its first run that works makes the destination; after it, a missing destination is
    an error (an unmounted Drive leaves a bare local folder that must not take the files).
    The thread never prints. A final sync at exit that fails is written to the process's
    stderr and recorded for the next session (``failed_syncs``).
    """

    def __init__(self, src: PathArg, dst: PathArg, every_s: float, **sync_options: Any) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, not {every_s!r}")
        self.src, self.dst = check_pair(src, dst)  # resolved: a later %cd changes nothing
        self.every_s = every_s
        self.options = {"progress": False, **sync_options}
        self.last_report: SyncReport | None = None
        self.last_error: BaseException | None = None
        self.replaced: BackgroundSync | None = None
        self._last_run: tuple[float, SyncReport | BaseException] | None = None  # when, outcome
        self._kept_at: float | None = None  # when last_error happened, until stop() raises it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> BackgroundSync:
        """Start syncing now and every ``every_s`` seconds; a no-op when already running.

        The background sync of the same pair, if one runs, is stopped first, without a
        final run (this one starts with a run), and kept in ``replaced``.
        """
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ipycloud-sync", daemon=True)
        atexit.register(self._at_exit)
        self.replaced = _running().put(self)
        if self.replaced is not None:
            self.replaced._halt()
        self._thread.start()
        return self

    @property
    def action_name(self) -> str:
        """Its name among the session guard's deadline actions."""
        return f"sync {self.src} -> {self.dst}"

    def sync_now(self) -> SyncReport:
        """Sync once now, in the calling thread; errors are raised, not kept."""
        try:  # after a run that worked, a missing destination is not made again
            self.last_report = sync(self.src, self.dst, **self.options,
                                    create_dst=self.last_report is None)
        except BaseException as error:
            self._last_run = (time.time(), error)
            raise
        self._last_run = (time.time(), self.last_report)
        return self.last_report

    def stop(self, final: bool = True) -> SyncReport | None:
        """Stop the thread, then sync once more unless ``final`` is False.

        Returns the last report; raises the error a background run kept, if any.
        """
        self._halt()
        if final:
            self.sync_now()
        if self._kept_at is not None and self.last_error is not None:
            self._kept_at = None
            raise self.last_error
        return self.last_report

    def _halt(self) -> None:
        """Stop the thread (after the run in progress) and forget it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        atexit.unregister(self._at_exit)
        _running().discard(self)

    def __str__(self) -> str:
        """In words: ``'/content/outputs' -> '/content/drive/MyDrive/outputs' every 5 min,
        running, last run at 12:03 ok: 3 copied, 0 updated, 0 deleted, 9 unchanged (2.0 MiB)``."""
        state = "running" if self.running else "stopped"
        return (f"{str(self.src)!r} -> {str(self.dst)!r} every {format_seconds(self.every_s)}, "
                f"{state}, {self._last_run_words()}")

    def __repr__(self) -> str:
        return f"BackgroundSync({self})"

    def _last_run_words(self) -> str:
        if self._last_run is None:
            return "no run yet"
        when, outcome = self._last_run
        if isinstance(outcome, BaseException):
            return f"last run at {_clock(when)} failed: {describe_error(outcome)}"
        words = f"last run at {_clock(when)} ok: {outcome.summary()}"
        if self._kept_at is not None and self.last_error is not None:
            words += f"; a run at {_clock(self._kept_at)} failed: {describe_error(self.last_error)}"
        return words

    def _loop(self) -> None:
        """The thread: sync, then wait, until stopped."""
        while not self._stop.is_set():
            self._run_once()
            self._stop.wait(self.every_s)

    def _run_once(self) -> None:
        """One background sync, its error kept rather than lost."""
        try:
            self.sync_now()
        except Exception as error:  # kept for str() and stop(), and shown in the log
            self.last_error, self._kept_at = error, time.time()
            _log.error("background sync %s -> %s failed: %s", self.src, self.dst, error)

    def _at_exit(self) -> None:
        """Interpreter exit: stop and sync a last time; a failure is reported where it can
        still be seen (an earlier run's error is moot once the final run has succeeded)."""
        self._halt()
        try:
            self.sync_now()
        except Exception as error:
            report_at_exit(self.src, self.dst, error)


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


class _Running:
    """The background syncs started in this process and not stopped yet, one per pair of
    folders, in start order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._syncs: dict[tuple[Path, Path], BackgroundSync] = {}

    def put(self, background: BackgroundSync) -> BackgroundSync | None:
        """List ``background`` last; the one of its pair it takes the place of, if any."""
        with self._lock:
            replaced = self._syncs.pop((background.src, background.dst), None)
            self._syncs[background.src, background.dst] = background
        return replaced

    def discard(self, background: BackgroundSync) -> None:
        """Forget ``background`` (not another one of its pair, started since)."""
        with self._lock:
            if self._syncs.get((background.src, background.dst)) is background:
                del self._syncs[background.src, background.dst]

    def of(self, src: Path, dst: Path) -> BackgroundSync | None:
        with self._lock:
            return self._syncs.get((src, dst))

    def listed(self) -> list[BackgroundSync]:
        with self._lock:
            return list(self._syncs.values())

    def stop_all(self) -> None:
        """Stop every one without a final run and without raising what it kept (a reset,
        not an exit)."""
        for background in self.listed():
            background._halt()


@per_process(close=_Running.stop_all)
def _running() -> _Running:
    return _Running()


def running_syncs() -> list[BackgroundSync]:
    """Every background sync of this process that is running, oldest first."""
    return _running().listed()


def background_sync_of(src: PathArg, dst: PathArg) -> BackgroundSync | None:
    """The background sync from ``src`` to ``dst`` that is running, if there is one (the
    folders are resolved as ``BackgroundSync`` resolves them; they need not exist)."""
    return _running().of(Path(src).resolve(), Path(dst).resolve())
