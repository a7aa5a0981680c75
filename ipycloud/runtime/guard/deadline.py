"""Deadline actions: the work that must happen before the session ends.

The session guard runs them before the platform's session limit and on SIGTERM. The
automatic checkpoint (``checkpoint.auto.register()``) always runs first, then a final run
of each running background sync (``storage.periodic_sync.running_syncs()``), then the actions
registered with ``register_action()`` in the order they were registered.

A run never overlaps another: a trigger that arrives while a run is in progress does not
start a second one, it waits for the running one and shares its results (the state it saves
is seconds old, and a second save would only eat into the grace period). One failing action
does not stop the others; every failure is kept in the run's results for the guard to show.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ipycloud.runtime.messages import describe_error

Action = Callable[[], object]

AUTO_CHECKPOINT = "checkpoint auto"  # the built-in action's name
_DETAIL_CHARS = 200

_actions: dict[str, Action] = {}
_actions_lock = threading.Lock()


def register_action(name: str, action: Callable[[], object]) -> None:
    """Run ``action()`` before the session ends; a second registration under ``name`` replaces it.

    Actions run on a background thread; what they return is shown as their result.
    """
    if not isinstance(name, str) or not name.strip() or name == AUTO_CHECKPOINT:
        raise ValueError(f"a deadline action needs a name other than {AUTO_CHECKPOINT!r}, "
                         f"got {name!r}")
    if not callable(action):
        raise ValueError(f"deadline action {name!r} must be callable, got "
                         f"{type(action).__name__}")
    with _actions_lock:
        _actions[name] = action


def unregister_action(name: str) -> None:
    """Stop running the action registered under ``name``; nothing happens if there is none."""
    with _actions_lock:
        _actions.pop(name, None)


def registered_actions() -> list[str]:
    """The names of the actions a run would execute now, in order."""
    return [name for name, _ in _snapshot()]


@dataclass(frozen=True)
class ActionResult:
    """How one action went: its return value or its error, as one line."""

    name: str
    ok: bool
    detail: str
    error: BaseException | None = field(default=None, compare=False)

    def describe(self) -> str:
        """``name: detail`` for a success, ``name FAILED: error`` for a failure."""
        return f"{self.name}: {self.detail}" if self.ok else f"{self.name} FAILED: {self.detail}"


@dataclass
class ActionRun:
    """One run of the deadline actions; ``results`` fill in as each action finishes."""

    reason: str
    results: list[ActionResult] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def failures(self) -> list[ActionResult]:
        """The results of the actions that raised."""
        return [result for result in self.results if not result.ok]

    def describe(self) -> str:
        """One line: why it ran, and each action's outcome."""
        if not self.done.is_set():
            state = "still running"
        elif not self.results:
            state = ("nothing registered (an automatic checkpoint, a background sync or "
                     "register_action())")
        else:
            state = f"{len(self.failures)} of {len(self.results)} failed" if self.failures else "ok"
        outcomes = "; ".join(result.describe() for result in self.results)
        return f"deadline actions ({self.reason}): {state}" + (f" - {outcomes}" if outcomes else "")


_run_lock = threading.Lock()
_current: ActionRun | None = None


def run_actions(reason: str) -> ActionRun:
    """Run the deadline actions now, or join the run already in progress; returns the run."""
    return run_or_join(reason)[0]


def run_or_join(reason: str) -> tuple[ActionRun, bool]:
    """``run_actions``, also saying whether this call joined a run already in progress."""
    global _current
    with _run_lock:
        joining = _current is not None and not _current.done.is_set()
        if not joining:
            _current = ActionRun(reason)
        run = _current
    assert run is not None
    if joining:
        run.done.wait()
        return run, True
    try:
        for name, action in _snapshot():
            run.results.append(_execute(name, action))
    finally:
        run.done.set()
    return run, False


def last_run() -> ActionRun | None:
    """The latest run, finished or in progress."""
    return _current


def _snapshot() -> list[tuple[str, Action]]:
    """The automatic checkpoint (when registered), the running background syncs, then the
    registered actions."""
    from ipycloud.runtime.checkpoint import auto
    from ipycloud.runtime.storage.periodic_sync import running_syncs

    registration = auto.registered()
    with _actions_lock:
        actions = list(_actions.items())
    builtin = [(AUTO_CHECKPOINT, registration.save_now)] if registration is not None else []
    syncs = [(background.action_name, background.sync_now) for background in running_syncs()]
    return [*builtin, *syncs, *actions]


def _execute(name: str, action: Action) -> ActionResult:
    try:
        value = action()
    except Exception as error:  # kept in the results and shown by the guard, never swallowed
        return ActionResult(name, False, describe_error(error), error)
    detail = "done" if value is None else " ".join(str(value).split())
    if len(detail) > _DETAIL_CHARS:
        detail = detail[:_DETAIL_CHARS - 1] + "…"
    return ActionResult(name, True, detail)
