"""Saves that never end a training run: a failing folder is written around.

``fit``, ``%checkpoint auto`` and the session guard's deadline saves write through the one
``ResilientSaver`` of their manager (``resilient_saver(manager)``). When a save into the
folder fails (a lost Drive mount, an I/O error, a full or read-only disk, the writer
process's death), the same state is saved at once into the manager's fallback folder on
the machine's scratch disk, and the user is warned, once for each kind of failure, with the
folder and the error. Each later save tries the folder again, until SWITCH_AFTER fail in a
row: then saves go straight to the fallback folder, and after each one the newest is copied
back into the folder in the background; the first copy that succeeds sends saves to the
folder again, so the folder is at most one checkpoint behind once it answers. A save that
neither folder takes leaves the state unsaved, and says so; training goes on.

What the user is told also goes to the saver's ``listener``, as an event: SAVE_FAILED (a
save the folder did not take, or neither folder took), FALLBACK (a save that went to the
fallback folder instead) or COPIED_BACK (the folder answers again).
"""

from __future__ import annotations

import errno as errnos
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.checkpoint.errors import (
    CheckpointError,
    CheckpointStorageError,
    CheckpointWarning,
)
from ipycloud.runtime.checkpoint.manager import Blocking, CheckpointManager
from ipycloud.runtime.checkpoint.save_details import SaveDetails
from ipycloud.runtime.per_process import per_process
from ipycloud.runtime.user_warning import warn

if TYPE_CHECKING:
    from typing_extensions import Unpack

SWITCH_AFTER = 2  # failed saves in a row after which saves go to the fallback folder
FINAL_COPY_WAIT_S = 30.0  # how long the end of a run waits for the last copy back
SAVE_FAILED, FALLBACK, COPIED_BACK = "save_failed", "fallback", "copied_back"


class ResilientSaver:
    """Saves of one manager that go around its folder while it fails (see the module)."""

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        self.newest: CheckpointInfo | None = None  # the newest this saver wrote, anywhere
        self.lost: int | None = None  # the step of the newest save that went nowhere
        self._failures = 0  # failed saves into the folder in a row
        self._warned: set[str] = set()  # the kinds of failure already told
        self._on_fallback = False
        self._notices: list[str] = []  # from the copying thread: told at the next call
        self.listener: Callable[[str, str], None] | None = None  # told (event, text)
        self._copying: threading.Thread | None = None
        self._lock = threading.Lock()  # between saves to the fallback folder and copying

    @property
    def on_fallback(self) -> bool:
        """Whether saves go to the fallback folder now (until the folder answers again)."""
        return self._on_fallback

    def save(self, state: Mapping[str, Any], step: int, *, blocking: Blocking = True,
             **details: Unpack[SaveDetails]) -> CheckpointInfo | None:
        """``CheckpointManager.save`` (``details``: its other keyword arguments), except
        that a failing folder raises nothing: the state goes to the fallback folder
        instead. Returns the checkpoint written (None for one still written in the
        background, or for one that went nowhere: ``lost``)."""
        self._tell_notices()
        if not self._on_fallback:
            self.wait()
        if not self._on_fallback:
            try:
                info = self.manager.save(state, step, blocking=blocking, **details)
            except CheckpointStorageError as error:
                problem = self._failed(error)
            else:
                self._succeeded(info)
                return info
        else:
            problem = None
        return self._save_to_fallback(state, step, details, problem)

    def wait(self) -> CheckpointInfo | None:
        """Wait for a background save; one that failed leaves ``lost`` set (the caller
        saves again: its state has moved on). Returns the newest checkpoint written."""
        self._tell_notices()
        try:
            self._succeeded(self.manager.wait())
        except CheckpointStorageError as error:
            self.lost = error.step
            self._tell(self._failed(error), SAVE_FAILED)
        return self.newest

    def resumed(self, info: CheckpointInfo) -> None:
        """A run continues from ``info``: where only the fallback folder holds it, copy it
        back into the folder in the background, as the next save would."""
        self._succeeded(info)
        if info.directory != self.manager.directory:
            self._copy_back_later()

    def next_step(self) -> int:
        """The manager's next step, or past the newest this saver wrote where the folder
        cannot be read now."""
        try:
            return self.manager.next_step()
        except CheckpointStorageError:
            saved = [info.step for info in (self.newest,) if info is not None]
            scratch = self.manager.fallback_folder.manager
            if scratch is not None:
                saved.append(scratch.next_step() - 1)
            return max(saved, default=-1) + 1

    def finish(self, copy_wait_s: float = FINAL_COPY_WAIT_S) -> str | None:
        """At the end of a run: wait for the saves, and up to ``copy_wait_s`` for the last
        copy back; one line that says where the newest checkpoint is (None when nothing
        was saved)."""
        self.wait()
        if self._on_fallback:
            self._copy_back_later()
        if self._copying is not None:
            self._copying.join(copy_wait_s)
        self._tell_notices()
        newest = self.newest
        if newest is None:
            return None
        if newest.directory == self.manager.directory:
            return f"the newest checkpoint is step {newest.step}, in {newest.directory}"
        return (f"the newest checkpoint is step {newest.step}, in {newest.directory} on this "
                f"machine only: {self.manager.directory} did not take it; rerunning resumes "
                "from it, and the next save copies it back once the folder answers")

    # -- failures ---------------------------------------------------------------------

    def _succeeded(self, info: CheckpointInfo | None) -> None:
        """Note a checkpoint written (``wait()`` also gives the last one again)."""
        if info is None or (self.newest is not None
                            and self._recency(info) <= self._recency(self.newest)):
            return
        self.newest, self.lost = info, None
        if info.directory == self.manager.directory:
            self._failures = 0

    def _recency(self, info: CheckpointInfo) -> tuple[float, int, bool]:
        """Newer is larger; of a checkpoint and its copy, the folder's."""
        return info.time, info.step, info.directory == self.manager.directory

    def _failed(self, error: CheckpointStorageError) -> str | None:
        """Count a failure of the folder; the words to tell once for its kind (and when
        saves move to the fallback folder), or None."""
        self._failures += 1
        told = []
        kind = _kind(error)
        if kind not in self._warned:
            self._warned.add(kind)
            told.append(f"saving into {self.manager.directory} failed: {error}")
        if self._failures >= SWITCH_AFTER and not self._on_fallback:
            self._on_fallback = True
            told.append(f"{self.manager.directory} failed {self._failures} saves in a row")
        return "; ".join(told) or None

    def _save_to_fallback(self, state: Mapping[str, Any], step: int, details: SaveDetails,
                          problem: str | None) -> CheckpointInfo | None:
        scratch = self._fallback()
        if scratch is None:
            self.lost = step
            self._tell(problem and f"{problem}; step {step} is not saved (no fallback folder)",
                       SAVE_FAILED)
            return None
        try:
            with self._lock:
                info = cast(CheckpointInfo, scratch.save(state, step, blocking=True,
                                                         **details))
                self._succeeded(info)
        except CheckpointStorageError as error:
            self.lost = step
            kind = f"fallback {_kind(error)}"
            if problem is not None or kind not in self._warned:
                self._warned.add(kind)
                self._tell(f"{problem or f'{self.manager.directory} is failing'}; step {step} "
                           f"could not be saved in {scratch.directory} either ({error}): it "
                           "is not saved, and training goes on", SAVE_FAILED)
            return None
        if problem is not None:
            self._tell(f"{problem}; step {step} is saved in {scratch.directory} instead, and "
                       "training goes on" + (
                           f": later saves go there until {self.manager.directory} answers "
                           "again (tried after each save)" if self._on_fallback else
                           f" ({self.manager.directory} is tried again at the next save)"),
                       FALLBACK)
        if self._on_fallback:
            self._copy_back_later()
        return info

    def _fallback(self) -> CheckpointManager | None:
        """The manager of the fallback folder (``fallback.FallbackFolder``), keeping as
        many checkpoints as the folder's."""
        return self.manager.fallback_folder.saving_manager(
            lambda folder: CheckpointManager(folder, keep_last=self.manager.keep_last,
                                             keep_best=self.manager.keep_best, fallback=None))

    # -- copying back -----------------------------------------------------------------

    def _copy_back_later(self) -> None:
        """Copy the newest checkpoint back on a thread of its own, unless one copies."""
        if self._copying is not None and self._copying.is_alive():
            return
        self._copying = threading.Thread(target=self._copy_back, daemon=True,
                                         name="ipycloud-copy-back")
        self._copying.start()

    def _copy_back(self) -> None:
        """Copy the newest checkpoint into the folder, again while a newer one was saved
        meanwhile; once a copy lands, saves go to the folder again (a newer checkpoint
        still in the fallback folder is copied meanwhile)."""
        copied: CheckpointInfo | None = None
        while True:
            with self._lock:
                newest = self.newest
                if newest is None or newest.directory == self.manager.directory:
                    self._on_fallback, self._failures = False, 0
                    break
            try:
                copy = self.manager.copy_in(newest, committed=self._copied_back)
            except CheckpointError:  # still failing: the next save tries again
                return
            if copy is None:  # a save landed in the folder meanwhile: it answers
                self._copied_back(None)
                break
            copied = copy
        if copied is not None:
            self._notices.append(f"{self.manager.directory} answers again: step "
                                 f"{copied.step} is copied back into it, and checkpoints go "
                                 "there again")

    def _copied_back(self, copy: CheckpointInfo | None) -> None:
        """The folder holds the newest checkpoint, or ``copy`` was just committed there:
        the next save goes there."""
        with self._lock:
            self._succeeded(copy)
            self._on_fallback, self._failures = False, 0

    # -- telling ----------------------------------------------------------------------

    def _tell_notices(self) -> None:
        notices, self._notices = self._notices, []
        for notice in notices:
            self._tell(notice, COPIED_BACK)

    def _tell(self, text: str | None, event: str) -> None:
        if text:
            warn(f"ipycloud: {text}", CheckpointWarning)
            if self.listener is not None:
                self.listener(event, text)


def _kind(error: CheckpointStorageError) -> str:
    """The kind of a failure, told once: its error number's name, or what failed (a
    background save's failure comes wrapped in the one that reports it)."""
    cause = error.__cause__
    while isinstance(cause, CheckpointStorageError):
        cause = cause.__cause__
    if isinstance(cause, OSError) and cause.errno is not None:
        return errnos.errorcode.get(cause.errno, str(cause.errno))
    return type(cause).__name__ if cause is not None else "writer"


@per_process()
def _savers() -> weakref.WeakKeyDictionary[CheckpointManager, ResilientSaver]:
    return weakref.WeakKeyDictionary()


def resilient_saver(manager: CheckpointManager) -> ResilientSaver:
    """The one ResilientSaver of ``manager`` in this process."""
    savers = _savers()
    saver = savers.get(manager)
    if saver is None:
        saver = savers[manager] = ResilientSaver(manager)
    return saver
