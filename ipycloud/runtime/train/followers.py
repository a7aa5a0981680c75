"""Those who follow a run of ``fit``: its record on disk, the live curves, alerts.

``fit`` tells every follower what happens, on the training thread, at these moments:
``started`` (once per call, after the resume), ``stepped`` (each logged row), ``epoch_ended``,
``checkpointed`` (each checkpoint written), ``happened`` (an event: pause, SIGTERM, early
stop, a failed save, out of memory...) and ``ended`` (once, however the call ends).
A follower must return fast; what is slow goes to a thread of its own. A follower that
raises is dropped with one warning: following a run never breaks it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# How a call of ``fit`` ended (RunEnd.status).
FINISHED, FAILED, PAUSED, STOPPED_EARLY = "finished", "failed", "paused", "stopped early"


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
    epoch by the metric the run watches (keep_best's, else early_stop's): ``{"metric",
    "value", "epoch"}``, or None."""

    status: str
    reason: str | None
    step: int
    epoch: int
    best: dict[str, Any] | None = None


class Follower(Protocol):
    """What ``fit`` tells a follower; every method is optional in practice (see Followers)."""

    def started(self, start: RunStart) -> None: ...
    def stepped(self, row: dict[str, Any]) -> None: ...
    def epoch_ended(self, logs: dict[str, Any]) -> None: ...
    def checkpointed(self, checkpoint: dict[str, Any]) -> None: ...
    def happened(self, event: str, message: str) -> None: ...
    def ended(self, end: RunEnd) -> None: ...


FollowerFactory = Callable[[RunStart], "Follower | None"]


class Followers:
    """Calls each follower that has the method; drops one that raises, with a warning."""

    def __init__(self, followers: Sequence[Any] = ()) -> None:
        self.followers = list(followers)

    def tell(self, method: str, *args: Any) -> None:
        for follower in list(self.followers):
            call = getattr(follower, method, None)
            if call is None:
                continue
            try:
                call(*args)
            except Exception as error:
                self.followers.remove(follower)
                warnings.warn(f"ipycloud.fit: {type(follower).__name__} stopped following "
                              f"the run: {type(error).__name__}: {error}", RuntimeWarning,
                              stacklevel=2)


_registered: list[FollowerFactory] = []


def register_follower(factory: FollowerFactory) -> None:
    """Have ``factory(start)`` make a follower of every later run (None declines); a
    front registers what only it can do, such as drawing in a notebook."""
    if factory not in _registered:
        _registered.append(factory)


def start_following(start: RunStart, built_in: Sequence[FollowerFactory] = ()) -> Followers:
    """The followers the ``built_in`` and registered factories make for ``start``, told
    that it started."""
    made = []
    for factory in [*built_in, *_registered]:
        try:
            follower = factory(start)
        except Exception as error:
            warnings.warn(f"ipycloud.fit: cannot follow the run ({factory.__name__}): "
                          f"{type(error).__name__}: {error}", RuntimeWarning, stacklevel=2)
            continue
        if follower is not None:
            made.append(follower)
    followers = Followers(made)
    followers.tell("started", start)
    return followers
