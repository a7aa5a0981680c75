"""CheckpointManager: save, rotate, verify and restore the training state of live objects."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ipycloud.runtime._optional import is_available, require
from ipycloud.runtime.checkpoint import catalog, integrity, leases, rng
from ipycloud.runtime.checkpoint.background import tensor_devices
from ipycloud.runtime.checkpoint.background_saves import (
    Background,
    BackgroundSaves,
    Blocking,
    WriteData,
    reporting_failures,
)
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo, CheckpointTable
from ipycloud.runtime.checkpoint.data_file import write_data_file
from ipycloud.runtime.checkpoint.errors import (
    CheckpointError,
    CheckpointStorageError,
    CheckpointWarning,
)
from ipycloud.runtime.checkpoint.fallback import FallbackFolder
from ipycloud.runtime.checkpoint.loading import load_verified
from ipycloud.runtime.checkpoint.restore import restore
from ipycloud.runtime.checkpoint.rotation import remove_leftovers, rotate
from ipycloud.runtime.checkpoint.save_details import (
    check_epoch,
    check_keep_last,
    check_step,
    finite_metrics,
    json_ready,
    versions,
)
from ipycloud.runtime.checkpoint.selection import KeepBest, Which, keep_best_rule, preferred
from ipycloud.runtime.checkpoint.state import capture
from ipycloud.runtime.durable import (
    FileDigest,
    commit_temporary,
    folder_lock,
    make_folder,
    mount_point,
    write_temporary,
)
from ipycloud.runtime.user_warning import warn

__all__ = ["KEEP_LAST", "Blocking", "CheckpointManager", "Which", "check_keep_last",
           "close_all", "default_directory"]


class _Superseded(Exception):
    """A copy into the folder is not needed: its run saved a newer checkpoint there."""

KEEP_LAST = 3  # the newest checkpoints a folder keeps unless told otherwise
_COPY_CHUNK = 1 << 20


Method = TypeVar("Method", bound=Callable[..., Any])


def _reading(method: Method) -> Method:
    """A manager method that reads the folder: an OSError (a lost mount, an I/O error)
    becomes a CheckpointStorageError naming the folder."""

    @functools.wraps(method)
    def reading(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except OSError as error:
            raise CheckpointStorageError(f"cannot read the folder {self.directory}: "
                                         f"{error.strerror or error}") from error

    return reading  # type: ignore[return-value]


class CheckpointManager:
    """Checkpoints of live training state in one folder: durable, rotated, verifiable.

    ``directory`` defaults to ``<platform persistent folder>/checkpoints/<run>``.
    ``keep_last`` newest checkpoints are kept (None keeps all); ``keep_best=("val_loss",
    "min")`` or ``("accuracy", "max", 2)`` also keeps the best by a metric, and
    ``load(which="best")`` loads the best. Tagged checkpoints are never rotated away.

    ``fallback`` is the local folder that holds saves while ``directory`` fails (see
    ``resilient``): "auto" for one on the machine's scratch disk, a folder, or None. Its
    checkpoints are listed and loaded beside the folder's own: the newest wins
    (``fallback_folder``, a ``fallback.FallbackFolder``, reads both).

    Each checkpoint belongs to a run (see ``leases``): this process continues the newest run
    in the folder whose writer is gone, or starts its own beside a run another live
    process writes. Rotation removes only checkpoints of this process's run; "latest" and
    "best" pick one of a run another live process writes only when the folder holds no
    other (a process that only reads the folder).

    ``background`` is how the saves that leave it open (``blocking="auto"``, as ``fit``'s
    periodic checkpoints) are written: "auto" in the background where that costs a training
    loop less (see ``save``), "never" at once, "process" or "thread" always in the
    background. A background save is written by a thread of this process with "thread";
    otherwise by the writer process where it can (Linux, a state in host memory), else by
    a thread.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None,
                 keep_last: int | None = KEEP_LAST, keep_best: tuple[Any, ...] | None = None,
                 *, run: str = "default", background: Background = "auto",
                 fallback: str | os.PathLike[str] | None = "auto") -> None:
        if not is_available("torch"):
            require("torch", "torch")  # raises the ImportError that names the extra
        check_keep_last(keep_last)
        self._saves = BackgroundSaves(background)
        self.directory = Path(directory) if directory is not None else default_directory(run)
        self.fallback_folder = FallbackFolder(self.directory, fallback)
        self.keep_last = keep_last
        self.keep_best: KeepBest | None = None if keep_best is None else keep_best_rule(keep_best)
        self._last_written: CheckpointInfo | None = None
        self._mount = mount_point(self.directory)  # of the folder's file system, as last seen

    def __repr__(self) -> str:
        pending = self._saves.pending
        writing = "" if pending is None else f", writing step {pending.step}"
        background = "" if self.background == "auto" else f", background={self.background!r}"
        return (f"CheckpointManager({str(self.directory)!r}, keep_last={self.keep_last!r}, "
                f"keep_best={self.keep_best!r}{background}{writing})")

    @property
    def background(self) -> Background:
        """How saves that leave it open are written: "auto", "process", "thread" or "never"."""
        return self._saves.mode

    # -- saving ------------------------------------------------------------------------------

    def save(self, state: Mapping[str, Any], step: int, *, epoch: int | None = None,
             data_position: Any = None, metrics: Mapping[str, float] | None = None,
             tag: str | None = None, blocking: Blocking = True,
             rng_states: Mapping[str, Any] | None = None) -> CheckpointInfo | None:
        """Save ``state`` (names -> live objects) as the checkpoint of ``step``.

        ``metrics`` that are NaN or infinite are left out of the manifest: they rank
        nothing. The random generators' states are recorded as they are now, or as
        ``rng_states`` gives them (``rng.capture_rng_states()`` taken earlier, for a state
        that stood still since).

        With ``blocking=False`` the state is copied to reused host buffers and written in
        the background at idle CPU priority: by a writer process (Linux, a state in host
        memory) or a thread. This returns None at once, and ``wait()`` gives the result.
        At most one write is in flight: the next call waits for it and raises its failure.
        ``blocking="auto"`` writes in the background only where that costs a training loop
        less: the state is on an accelerator, or torch's threads
        leave a core free; otherwise it writes at once and returns the checkpoint. The
        manager's ``background`` can make "auto" always or never write in the background.
        """
        self.wait()
        check_step(step)
        check_epoch(epoch)
        if not isinstance(blocking, bool) and blocking != "auto":
            raise ValueError(f"blocking must be True, False or 'auto', not {blocking!r}")
        catalog.validate_tag(tag)
        checked_metrics = finite_metrics(metrics)
        position = json_ready(data_position, "data_position")
        captured = capture(state)
        rng_states = rng.capture_rng_states() if rng_states is None else dict(rng_states)
        self._make_folder()
        with self._storage(f"cannot read the folder {self.directory}"):
            run = self._claim_run()
        details: dict[str, Any] = {
            "run": run, "step": step, "time": time.time(), "tag": tag,
            "epoch": epoch,
            "data_position": position, "metrics": checked_metrics, "objects": captured.kinds,
            "rng": sorted(rng_states), "versions": versions(),
            "keep_best": None if self.keep_best is None else list(self.keep_best)}
        payload = {"format": catalog.FORMAT, "state": captured.saved, "kinds": captured.kinds,
                   "shapes": captured.shapes, "rng": rng_states}
        devices = tensor_devices(captured.saved)
        if not self._saves.wanted(blocking, devices):
            return self._write(details, payload, write_data_file)
        pending = CheckpointInfo(name=catalog.base_name(step, tag), directory=self.directory,
                                 sequence=0, status=catalog.WRITING, **details)
        self._saves.start(pending, payload, devices <= {"cpu"},
                          functools.partial(self._write, details))
        return None

    def _make_folder(self) -> None:
        """Make the folder, unless the file system it was on is mounted no more."""
        with self._storage(f"cannot create the folder {self.directory}"):
            self._mount = make_folder(self.directory, self._mount) or self._mount

    def _claim_run(self) -> str:
        """This process's run in the folder, claimed at its first save there."""
        run = leases.claimed(self.directory)
        if run is None or not leases.leased(self.directory):
            run = leases.claim(self.directory, catalog.read_catalog(self.directory)[0])
        return run

    def run_id(self) -> str:
        """The run this process writes in the folder (``CheckpointInfo.run`` of its
        checkpoints), claimed now as a first save claims it (the folder made, this
        process's lease written) if it has not saved here yet: the run it loaded from,
        else the newest run whose writer is gone, else a new one.
        CheckpointStorageError when the folder fails."""
        self._make_folder()
        with self._storage(f"cannot read the folder {self.directory}"):
            return self._claim_run()

    @property
    def writing(self) -> bool:
        """Whether an asynchronous save is still being written (``wait()`` would block)."""
        return self._saves.busy()

    def wait(self) -> CheckpointInfo | None:
        """Wait for an asynchronous save; raise its failure; return the last checkpoint written."""
        self._saves.wait()
        return self._last_written

    def close(self) -> None:
        """Wait for an asynchronous save (raising its failure), then end the writer process.

        The manager stays usable: a later background save starts a new writer.
        """
        self._saves.close()

    def copy_in(self, info: CheckpointInfo,
                committed: Callable[[CheckpointInfo], None] | None = None
                ) -> CheckpointInfo | None:
        """Copy a checkpoint of another folder (a fallback folder's) into this one, as its
        newest checkpoint of this process's run; returns the copy. ``committed`` is called
        with it as soon as its manifest is written (before old checkpoints are rotated away).
        Nothing is copied, and None returned, where the run already has a newer checkpoint
        here (saved meanwhile): a copy would rotate it away as the older one.

        The copy is checked against ``info``'s manifest before it is committed;
        CheckpointStorageError when this folder fails, CheckpointError when the source
        does not match its manifest.
        """
        expected = info.files.get(info.data_path.name, {})

        def copy(path: Path, _payload: Any) -> FileDigest:
            with open(info.data_path, "rb") as source:
                temporary, digest = write_temporary(
                    path, lambda file: shutil.copyfileobj(source, file, _COPY_CHUNK))
            if (digest.size, digest.crc32) != (expected.get("size"), expected.get("crc32")):
                temporary.unlink()
                raise CheckpointError(f"{info.data_path} does not match its manifest: "
                                      "not copied")
            commit_temporary(temporary, path)
            return digest

        self._make_folder()
        with self._storage(f"cannot read the folder {self.directory}"):
            run = self._claim_run()
        details = {field.name: getattr(info, field.name) for field in dataclasses.fields(info)
                   if field.name not in ("name", "directory", "sequence", "files", "status")}
        details["metrics"] = finite_metrics(info.metrics)  # one from elsewhere may hold NaN

        def superseded(infos: list[CheckpointInfo]) -> bool:
            return any(other.run == run and other.time > info.time for other in infos)

        try:
            return self._write({**details, "run": run}, {}, copy, committed, superseded)
        except _Superseded:
            return None

    def _write(self, details: dict[str, Any], payload: dict[str, Any],
               write_data: WriteData,
               committed: Callable[[CheckpointInfo], None] | None = None,
               superseded: Callable[[list[CheckpointInfo]], bool] | None = None
               ) -> CheckpointInfo:
        """Write one checkpoint; its name and sequence number are picked under the lock.

        ``details`` are the CheckpointInfo fields other than name, directory and sequence;
        ``write_data`` writes the payload to the data file; ``committed`` is told of the
        checkpoint once its manifest is written; where ``superseded`` finds the folder's
        checkpoints make this one needless, nothing is written (_Superseded).
        """
        with (self._storage(f"cannot use the folder {self.directory}"),
              folder_lock(self.directory)):
            remove_leftovers(self.directory)
            infos, _ = catalog.read_catalog(self.directory)
            if superseded is not None and superseded(infos):
                raise _Superseded
            info = CheckpointInfo(
                name=catalog.new_name(details["step"], details["tag"], self.directory),
                directory=self.directory, sequence=infos[-1].sequence + 1 if infos else 1,
                **details)
            try:
                digest = write_data(info.data_path, payload)
                integrity.remember_written(info.data_path, digest.crc32)
                info = dataclasses.replace(info, files={info.data_path.name: {
                    "size": digest.size, "crc32": digest.crc32}})
                catalog.write_manifest(info)
                if committed is not None:
                    committed(info)
            except (OSError, CheckpointStorageError) as error:
                with contextlib.suppress(OSError):  # never committed: no manifest names it
                    info.data_path.unlink(missing_ok=True)
                if isinstance(error, CheckpointStorageError):  # the writer process's death
                    error.step = info.step
                    raise
                raise CheckpointStorageError(
                    f"could not write {info.name} in {self.directory}: "
                    f"{error.strerror or error}; the previous checkpoints are untouched",
                    info.step) from error
            with self._storage(f"{info.name} is saved, but updating 'latest' or removing "
                               "old checkpoints failed"):
                catalog.write_latest_pointer(self.directory, info.name)
                rotate(self.directory, [*infos, info], self.keep_last, self.keep_best)
        self._last_written = info
        return info

    @contextlib.contextmanager
    def _storage(self, failing: str) -> Iterator[None]:
        """Turn an OSError into a CheckpointStorageError: ``failing``, then why."""
        try:
            yield
        except OSError as error:
            raise CheckpointStorageError(f"{failing}: {error.strerror or error}") from error

    # -- reading -----------------------------------------------------------------------------

    @property
    def fallback(self) -> Path | None:
        """The local folder that holds saves while the folder fails, or None."""
        return self.fallback_folder.path

    @_reading
    def list(self) -> list[CheckpointInfo]:
        """The checkpoints in the folder, oldest first, then the one being written, if any.

        Fast: manifests and file sizes only. ``status`` is "writing" for a save still in
        the background, "damaged" for a data file of the wrong size or one this process
        found failing its checksum, "complete" otherwise.
        """
        self._require_directory()
        pending = self._saves.pending  # read first: its manifest may appear while listing
        infos = [info if integrity.problem(info, read=False) is None
                 else dataclasses.replace(info, status=catalog.DAMAGED)
                 for info in self.fallback_folder.read()[0]]
        if pending is None or any((info.step, info.time) == (pending.step, pending.time)
                                  for info in infos):
            return infos
        return [*infos, pending]

    @_reading
    def table(self) -> CheckpointTable:
        """``list()`` as a table for notebooks and terminals, with "latest" on the newest
        checkpoint that verifies (its checksum is read unless this process knows it)."""
        self._require_directory()
        damaged: set[Path] = set()
        latest = next(self._verified("latest", lambda info, _: damaged.add(info.data_path)),
                      None)
        infos = [dataclasses.replace(info, status=catalog.DAMAGED)
                 if info.data_path in damaged else info for info in self.list()]
        return CheckpointTable(self.directory, infos, latest)

    @_reading
    def next_step(self) -> int:
        """One more than the highest step saved here, or 0 for an empty folder (the runs
        another live process writes left out)."""
        try:
            self._require_directory()
        except CheckpointError:
            return 0
        others = self.fallback_folder.live_runs()
        return max((info.step for info in self.list() if info.run not in others),
                   default=-1) + 1

    @_reading
    def latest(self) -> CheckpointInfo | None:
        """The newest checkpoint that passes verification, or None when there is none."""
        self._require_directory()
        return next(self._verified("latest"), None)

    @_reading
    def load(self, state: Mapping[str, Any], which: Which = "latest", map_location: Any = None,
             strict: bool = True, *, restore_rng: bool = True,
             unsafe_allow_pickle: bool = False,
             best_by: tuple[str, str] | None = None) -> CheckpointInfo:
        """Restore ``state``'s live objects (and the RNG states) from a checkpoint.

        ``which`` is "latest", "best" (by the ``keep_best`` metric: this manager's, or
        the one the checkpoints were saved with, or ``best_by=(metric, 'min' or 'max')``
        given here), a step number, or a tag or name. For
        "latest" and "best", a checkpoint failing verification is skipped with a
        CheckpointWarning and the next one is used. Every object is checked against the
        checkpoint before any is written: a failed restore changes nothing. Loading uses
        ``torch.load(weights_only=True)``; a file that needs arbitrary unpickling is
        refused unless ``unsafe_allow_pickle=True``, which lets the file run any code it
        carries: use it only for files you made yourself.
        """
        self.wait()
        self._require_directory()
        info, payload = load_verified(
            self._candidates(which, best_by=best_by), self.directory, map_location,
            unsafe_allow_pickle, lambda info, problem: self._damaged(info, problem, which))
        restore(state, payload["state"], strict, payload.get("kinds"), payload.get("shapes"))
        if restore_rng:
            rng.restore_rng_states(payload.get("rng", {}))
        if info.run not in self.fallback_folder.live_runs():
            leases.adopt(self.directory, info.run)  # later saves continue its run
        return info

    def _require_directory(self) -> None:
        if not self.fallback_folder.exists():
            raise CheckpointError(f"no checkpoint folder at {self.directory}")

    def _verified(self, which: Which,
                  damaged: Callable[[CheckpointInfo, str], object] | None = None
                  ) -> Iterator[CheckpointInfo]:
        """Candidates for ``which``, in order of preference, that pass verification.

        Each that fails goes to ``damaged(info, problem)``: by default a warning (or an
        error for a checkpoint named by ``which``); given one, nothing is warned.
        """
        for info in self._candidates(which, tell_unreadable=damaged is None):
            problem = integrity.problem(info)
            if problem is None:
                yield info
            elif damaged is None:
                self._damaged(info, problem, which)
            else:
                damaged(info, problem)

    def _candidates(self, which: Which, *, tell_unreadable: bool = True,
                    best_by: tuple[str, str] | None = None) -> Sequence[CheckpointInfo]:
        """Checkpoints matching ``which``, preferred first (``selection.preferred``); for
        "latest" and "best", those of runs another live process writes only when there is
        no other."""
        found, unreadable = self.fallback_folder.read()
        for name in unreadable if tell_unreadable else ():
            warn(f"checkpoint manifest {name} in {self.directory} is unreadable; "
                 "skipping it", CheckpointWarning)
        infos = self._without_others(found) if which in ("latest", catalog.BEST) else found
        return preferred(infos, which, self.directory, self.keep_best, best_by)

    def live_writers(self) -> dict[str, leases.Writer]:
        """The runs in the folder that another live process on this machine writes, by run
        id (``CheckpointInfo.run``), with the process that writes each."""
        return self.fallback_folder.live_runs()

    def _without_others(self, infos: Sequence[CheckpointInfo]) -> Sequence[CheckpointInfo]:
        """``infos`` less those of runs another live process writes, unless that leaves
        none (this process only reads the folder: its newest is what it asks for)."""
        others = self.fallback_folder.live_runs()
        mine = [info for info in infos if info.run not in others]
        return mine or infos

    def _damaged(self, info: CheckpointInfo, problem: str, which: Which) -> None:
        """Skip a damaged checkpoint with a warning for "latest" and "best"; refuse it when
        named."""
        if which not in ("latest", catalog.BEST):
            raise CheckpointError(f"checkpoint {info.name} is damaged: {problem}")
        instead = "the previous one" if which == "latest" else "the next best"
        warn(f"checkpoint {info.name} in {self.directory} is damaged ({problem}); "
             f"using {instead}", CheckpointWarning)


def default_directory(run: str, option: str = "directory=") -> Path:
    """``<persistent folder>/checkpoints/<run>`` for this platform; ``option`` is how the
    caller's reader names another folder (a magic: ``--dir``)."""
    from ipycloud.runtime.machine.platform import detect_platform

    platform = detect_platform()
    if platform.persistent_dir is None:
        warn(f"nothing survives a {platform.name} session: checkpoints go to "
             f"{platform.scratch_dir}; download them or pass {option}",
             CheckpointWarning)
        return platform.scratch_dir / "checkpoints" / run
    if not platform.persistent_dir.is_dir():
        raise CheckpointError(f"the persistent folder {platform.persistent_dir} of "
                              f"{platform.name} does not exist: mount it first, or pass "
                              f"{option}")
    return platform.persistent_dir / "checkpoints" / run


def close_all(managers: Iterable[CheckpointManager]) -> None:
    """Close each manager (waiting for its saves); a failed save is reported, not lost."""
    reporting_failures(manager.close for manager in managers)
