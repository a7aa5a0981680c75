"""``Callback``: what ``fit`` tells of a run, to the user's callbacks and to its own parts.

``fit`` calls, on the training thread, at these moments:

- ``on_start(start)``: once a call, after the resume, before the first step (RunStart);
- ``on_step(step, logs)``: after every optimizer step; ``logs`` holds ``step``, ``epoch``,
  ``loss``, ``lr``, ``steps_per_s`` and ``samples_per_s``, the loss (the mean since the last
  row) read only every ``log_every`` steps and None in between. A callback whose
  ``every_step`` is False is called on those logged rows only, at no cost to the others;
- ``on_epoch(epoch, logs)``: each epoch's end, with its ``train_loss`` and ``val_*``;
- ``on_checkpoint(info)``: each checkpoint this call wrote (a CheckpointInfo);
- ``on_event(event, message)``: pause, sigterm, early_stop, resume, out_of_memory,
  storage trouble...;
- ``on_end(end)``: once, however the call ends (RunEnd).

A hook that raises StopTraining ends the run after the current step (or epoch) as
"stopped early", with its checkpoint saved. Any other error of a user's callback stops
``fit`` with its traceback, like an error of the loss; one of ``fit``'s own parts (the run
record, the live curves, alerts) is dropped with one warning: following a run never breaks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ipycloud.runtime.user_warning import warn

if TYPE_CHECKING:
    from ipycloud.runtime.checkpoint.catalog import CheckpointInfo

# How a call of ``fit`` ended (RunEnd.status).
FINISHED, FAILED, PAUSED, STOPPED_EARLY = "finished", "failed", "paused", "stopped early"
HOOKS = ("on_start", "on_step", "on_epoch", "on_checkpoint", "on_event", "on_end")


@dataclass(frozen=True)
class RunStart:
    """What is known of a run when its steps begin."""

    folder: Path | None  # the checkpoint folder, None without checkpoint=
    step: int  # optimizer steps already taken (a resumed run's)
    epoch: int
    total_steps: int | None  # where the run ends, when known
    epochs: int | None
    max_steps: int | None
    main: bool  # the process that writes checkpoints and shows progress
    details: dict[str, Any] = field(default_factory=dict)  # device, precision, model...
    curves: bool = False  # live curves asked for (progress=True, on the main process)
    run: str | None = None  # the checkpoint run's id (CheckpointInfo.run), where known
    # The rows logged before this call (a resumed run's): History.steps and History.epochs.
    past_steps: tuple[dict[str, Any], ...] = ()
    past_epochs: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class RunEnd:
    """How a call of ``fit`` ended: ``status`` is one of FINISHED, FAILED, PAUSED (an
    interrupt or a SIGTERM; rerunning continues) or STOPPED_EARLY. ``best`` is the best
    epoch by the metric the run watches (keep_best's, else EarlyStopping's): ``{"metric",
    "value", "epoch"}``, or None."""

    status: str
    reason: str | None
    step: int
    epoch: int
    best: dict[str, Any] | None = None


class StopTraining(Exception):
    """Raised by a callback's hook to end the run after the current step or epoch, saved,
    as "stopped early"; the message says why."""


@runtime_checkable
class Callback(Protocol):
    """Subclass it and override the hooks you need (the others do nothing); pass instances
    as ``fit(..., callbacks=[...])``. See the module's docstring for when each is called."""

    every_step: bool = True  # False: on_step only for the logged rows

    def on_start(self, start: RunStart) -> None:
        """The run starts (or resumes) here."""
        return None  # nothing, unless overridden

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        """An optimizer step ended; ``logs["loss"]`` is None between logged rows."""
        return None  # nothing, unless overridden

    def on_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        """An epoch ended, with its metrics."""
        return None  # nothing, unless overridden

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        """A checkpoint of this call was written."""
        return None  # nothing, unless overridden

    def on_event(self, event: str, message: str) -> None:
        """Something happened: a pause, a SIGTERM, an early stop, a failing folder..."""
        return None  # nothing, unless overridden

    def on_end(self, end: RunEnd) -> None:
        """The call ended, however it ended."""
        return None  # nothing, unless overridden


CallbackFactory = Callable[[RunStart], "Callback | None"]


def check_callbacks(callbacks: Any) -> list[Callback]:
    """The user's callbacks, or a one-line TypeError for one that is not a Callback or
    defines a hook that fit never calls (a misspelt name)."""
    if isinstance(callbacks, Callback) or not isinstance(callbacks, Sequence | set):
        raise TypeError(f"callbacks must be a list of ipycloud.Callback, not "
                        f"{type(callbacks).__name__}")
    for callback in callbacks:
        name = type(callback).__name__
        if not isinstance(callback, Callback):
            raise TypeError(f"callbacks: {name} is not an ipycloud.Callback: subclass it and "
                            f"override the hooks you need ({', '.join(HOOKS)})")
        unknown = sorted(attribute for attribute in dir(type(callback))
                         if attribute.startswith("on_") and attribute not in HOOKS)
        if unknown:
            raise TypeError(f"callbacks: {name}.{unknown[0]} is not a hook fit calls (they "
                            f"are {', '.join(HOOKS)})")
    return list(callbacks)


class RunCallbacks:
    """Calls the hooks of a run's callbacks, fit's own parts (``own``: the record first,
    so that a user's hook finds the moment recorded) and then the user's (``user``), and
    notes the first stop asked for."""

    def __init__(self, user: Sequence[Callback]) -> None:
        self.user = list(user)
        self.own: list[Callback] = []
        self.stop_reason: str | None = None
        self.per_step: list[Callback] = []  # on_step after every step
        self.per_row: list[Callback] = []  # on_step for the logged rows only
        self._sort()

    def join(self, own: Sequence[Callback]) -> None:
        """Add fit's own parts, made once the run starts."""
        self.own = list(own)
        self._sort()

    def _sort(self) -> None:
        stepping = [callback for callback in [*self.own, *self.user]
                    if getattr(callback.on_step, "__func__", None) is not Callback.on_step]
        self.per_step = [callback for callback in stepping if callback.every_step]
        self.per_row = [callback for callback in stepping if not callback.every_step]

    def tell(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on every callback."""
        self._call([*self.own, *self.user], hook, args)

    def step(self, step: int, logs: dict[str, Any]) -> None:
        """``on_step`` after an optimizer step, for the callbacks that want every step."""
        self._call(self.per_step, "on_step", (step, logs))

    def row(self, step: int, logs: dict[str, Any]) -> None:
        """``on_step`` with a logged row, for the callbacks that want the rows only."""
        self._call(self.per_row, "on_step", (step, logs))

    def _call(self, callbacks: list[Callback], hook: str, args: tuple[Any, ...]) -> None:
        for callback in callbacks:
            try:
                getattr(callback, hook)(*args)
            except StopTraining as stop:
                if self.stop_reason is None:
                    self.stop_reason = (str(stop)
                                        or f"{type(callback).__name__}.{hook} asked to stop")
            except Exception as error:
                if callback not in self.own:
                    raise  # the user's code: its error stops fit, with its traceback
                self.own.remove(callback)
                self._sort()
                warn(f"ipycloud.fit: {type(callback).__name__} stopped following "
                     f"the run: {type(error).__name__}: {error}", RuntimeWarning)


_fronts: list[CallbackFactory] = []


def register_front(factory: CallbackFactory) -> None:
    """Have ``factory(start)`` make a callback of every later run (None declines): a front
    registers what only it can do, such as drawing in a notebook, when it loads."""
    if factory not in _fronts:
        _fronts.append(factory)


def own_callbacks(start: RunStart, built_in: Sequence[CallbackFactory]) -> list[Callback]:
    """The callbacks that the ``built_in`` factories and the fronts' make for ``start``."""
    made = []
    for factory in [*built_in, *_fronts]:
        try:
            callback = factory(start)
        except Exception as error:
            warn(f"ipycloud.fit: cannot follow the run ({factory.__name__}): "
                 f"{type(error).__name__}: {error}", RuntimeWarning)
            continue
        if callback is not None:
            made.append(callback)
    return made
