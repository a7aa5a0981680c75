"""CheckpointManager: save, rotate, verify and restore the training state of live objects."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import os
import pickle
import re
import shutil
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from ipycloud._version import __version__
from ipycloud.runtime._optional import is_available, require
from ipycloud.runtime.checkpoint import catalog, integrity, leases, rng, writer_process
from ipycloud.runtime.checkpoint.background import (
    IDLE_PRIORITY_S,
    BackgroundWriter,
    background_pays_off,
    tensor_devices,
)
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo, CheckpointTable
from ipycloud.runtime.checkpoint.data_file import write_data_file
from ipycloud.runtime.checkpoint.errors import (
    CheckpointError,
    CheckpointStorageError,
    CheckpointWarning,
    UnsafeCheckpointError,
)
from ipycloud.runtime.checkpoint.fallback import fallback_directory, read_both
from ipycloud.runtime.checkpoint.restore import restore
from ipycloud.runtime.checkpoint.state import HostBuffers, capture
from ipycloud.runtime.checkpoint.writer_process import WriterProcess
from ipycloud.runtime.durable import (
    FileDigest,
    commit_temporary,
    folder_lock,
    fsync_folder,
    make_folder,
    mount_point,
    side_by_side,
    stale_temporaries,
    write_temporary,
)
from ipycloud.runtime.messages import worded
from ipycloud.runtime.units import finite_number

Which = str | int
Blocking = bool | Literal["auto"]
Background = Literal["auto", "process", "thread", "never"]
BACKGROUNDS: tuple[Background, ...] = ("auto", "process", "thread", "never")
WriteData = Callable[[Path, Any], FileDigest]  # writes a payload to a data file atomically


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
    checkpoints are listed and loaded beside the folder's own: the newest wins.

    Each checkpoint belongs to a run (see ``runs``): this process continues the newest run
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
        if background not in BACKGROUNDS:
            raise ValueError("background must be 'auto', 'process', 'thread' or 'never', "
                             f"not {background!r}")
        self.background = background
        self.directory = Path(directory) if directory is not None else default_directory(run)
        self._fallback = (None if fallback is None else
                          fallback if fallback == "auto" else Path(fallback))
        self.keep_last = keep_last
        self.keep_best = None if keep_best is None else _keep_best_rule(keep_best)
        self._buffers = HostBuffers()  # for states on an accelerator, written by a thread
        self._process: WriterProcess | None = None  # writes states in host memory
        self._writer = BackgroundWriter("ipycloud-checkpoint-writer")
        weakref.finalize(self, self._writer.close)
        self._failure: BaseException | None = None
        self._last_written: CheckpointInfo | None = None
        self._pending: CheckpointInfo | None = None  # until its manifest is written
        self._mount = mount_point(self.directory)  # of the folder's file system, as last seen
        _LIVE_MANAGERS.add(self)

    def __repr__(self) -> str:
        pending = self._pending
        writing = "" if pending is None else f", writing step {pending.step}"
        background = "" if self.background == "auto" else f", background={self.background!r}"
        return (f"CheckpointManager({str(self.directory)!r}, keep_last={self.keep_last!r}, "
                f"keep_best={self.keep_best!r}{background}{writing})")

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
        _check_step(step)
        if not isinstance(blocking, bool) and blocking != "auto":
            raise ValueError(f"blocking must be True, False or 'auto', not {blocking!r}")
        catalog.validate_tag(tag)
        checked_metrics = _metrics(metrics)
        position = _json_ready(data_position, "data_position")
        captured = capture(state)
        rng_states = rng.capture_rng_states() if rng_states is None else dict(rng_states)
        self._make_folder()
        with self._storage(f"cannot read the folder {self.directory}"):
            run = self._claim_run()
        details: dict[str, Any] = {
            "run": run, "step": step, "time": time.time(), "tag": tag,
            "epoch": epoch,
            "data_position": position, "metrics": checked_metrics, "objects": captured.kinds,
            "rng": sorted(rng_states), "versions": _versions(),
            "keep_best": None if self.keep_best is None else list(self.keep_best)}
        payload = {"format": catalog.FORMAT, "state": captured.saved, "kinds": captured.kinds,
                   "shapes": captured.shapes, "rng": rng_states}
        devices = tensor_devices(captured.saved)
        if not self._in_background(blocking, devices):
            return self._write(details, payload, write_data_file)
        staged, write_data = self._stage(payload, in_host_memory=devices <= {"cpu"})
        self._pending = CheckpointInfo(name=catalog.base_name(step, tag),
                                       directory=self.directory, sequence=0,
                                       status=catalog.WRITING, **details)
        # The timer holds the manager weakly (one dropped meanwhile closes its writer), and
        # the save's end cancels it (its thread ends then, not seconds later).
        deadline = threading.Timer(IDLE_PRIORITY_S, _hurry_if_alive, (weakref.ref(self),))
        deadline.name, deadline.daemon = PRIORITY_TIMER_NAME, True
        self._writer.submit(
            lambda: self._write_in_background(details, staged, write_data, deadline))
        deadline.start()
        return None

    def _in_background(self, blocking: Blocking, devices: set[str]) -> bool:
        if isinstance(blocking, bool):
            return not blocking
        if self.background == "auto":
            return background_pays_off(devices)
        return self.background != "never"

    def _make_folder(self) -> None:
        """Make the folder, unless the file system it was on is mounted no more."""
        with self._storage(f"cannot create the folder {self.directory}"):
            self._mount = make_folder(self.directory, self._mount) or self._mount

    def _claim_run(self) -> str:
        """This process's run in the folder, claimed at its first save there."""
        run = leases.claimed(self.directory)
        if run is None or not leases.leased(self.directory):
            run = leases.claim(self.directory, catalog.read_catalog(self.directory)[0],
                             stacklevel=4)
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

    def _stage(self, payload: dict[str, Any],
               in_host_memory: bool) -> tuple[dict[str, Any], WriteData]:
        """Copy the live state in ``payload`` into host buffers; return the payload with
        the copy, and what will write it. (The rest of the payload is made afresh by each
        save.)

        A state in host memory goes to shared memory for the writer process, where this
        system has one, the memory can be had and ``background`` is not "thread"; any
        other state goes to host buffers (pinned for an accelerator's) for a thread.
        """
        if self.background != "thread" and writer_process.supported() and in_host_memory:
            if self._process is None or not self._process.owned_here():
                self._process = WriterProcess()  # a forked child starts its own
            with contextlib.suppress(OSError):  # no shared memory: a thread writes it
                staged = self._process.stage(payload["state"])
                return {**payload, "state": staged}, self._process.write
        return {**payload, "state": self._buffers.copy(payload["state"])}, write_data_file

    @property
    def writing(self) -> bool:
        """Whether an asynchronous save is still being written (``wait()`` would block)."""
        return self._writer.busy()

    def _hurry(self) -> None:
        """Give an asynchronous save normal CPU priority (its thread and writer process)."""
        if self._process is not None and self._process.owned_here():
            self._process.hurry()
        self._writer.hurry()

    def wait(self) -> CheckpointInfo | None:
        """Wait for an asynchronous save; raise its failure; return the last checkpoint written."""
        self._hurry()
        self._writer.join()
        failure, self._failure = self._failure, None
        if isinstance(failure, CheckpointStorageError):
            raise CheckpointStorageError(f"the previous asynchronous save failed: {failure}",
                                         failure.step) from failure
        if failure is not None:
            raise CheckpointError(f"the previous asynchronous save failed: {failure}") from failure
        return self._last_written

    def close(self) -> None:
        """Wait for an asynchronous save (raising its failure), then end the writer process.

        The manager stays usable: a later background save starts a new writer.
        """
        try:
            self.wait()
        finally:
            self._writer.close()
            if self._process is not None and self._process.owned_here():
                self._process.close()
            self._process = None

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
        details["metrics"] = _metrics(info.metrics)  # a manifest from elsewhere may hold NaN
        def superseded(infos: list[CheckpointInfo]) -> bool:
            return any(other.run == run and other.time > info.time for other in infos)

        try:
            return self._write({**details, "run": run}, {}, copy, committed, superseded)
        except _Superseded:
            return None

    def _write_in_background(self, details: dict[str, Any], payload: dict[str, Any],
                             write_data: WriteData, deadline: threading.Timer) -> None:
        try:
            self._write(details, payload, write_data)
        except BaseException as error:  # kept for the next call, never lost
            self._failure = error
        finally:
            deadline.cancel()
            self._pending = None

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
            self._remove_leftovers()
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
                self._pending = None
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
                self._rotate([*infos, info])
        self._last_written = info
        return info

    @contextlib.contextmanager
    def _storage(self, failing: str) -> Iterator[None]:
        """Turn an OSError into a CheckpointStorageError: ``failing``, then why."""
        try:
            yield
        except OSError as error:
            raise CheckpointStorageError(f"{failing}: {error.strerror or error}") from error

    def _remove_leftovers(self) -> None:
        """Temporary files of dead writers and data files whose manifest never appeared."""
        leftovers = list(stale_temporaries(self.directory))
        leftovers += [data for data in self.directory.glob(f"step-*{catalog.DATA_SUFFIX}")
                      if catalog.is_checkpoint_name(data.stem)
                      and not data.with_suffix(catalog.MANIFEST_SUFFIX).exists()]
        for path in leftovers:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if leftovers:
            fsync_folder(self.directory)

    def _rotate(self, infos: list[CheckpointInfo]) -> None:
        """Delete what the keep rules no longer cover among ``infos`` (oldest first) of the
        run of the newest, the last of them; runs only after that one is complete.

        Checkpoints saved before runs existed count as the run's own.
        """
        infos = [info for info in infos if info.run in (infos[-1].run, None)]
        keep = {infos[-1].name} | {info.name for info in infos if info.tag}
        untagged = [info for info in infos if not info.tag]
        if self.keep_last is None:
            keep |= {info.name for info in untagged}
        else:
            keep |= {info.name for info in untagged[-self.keep_last:]}
        if self.keep_best is not None:
            metric, mode, count = self.keep_best
            keep |= {info.name for info in _ranked(infos, metric, mode)[:count]}
        doomed = [info for info in infos if info.name not in keep]
        for info in doomed:  # the manifest goes first: the checkpoint vanishes atomically
            info.manifest_path.unlink(missing_ok=True)
            info.data_path.unlink(missing_ok=True)
        if doomed:
            fsync_folder(self.directory)

    # -- reading -----------------------------------------------------------------------------

    @property
    def fallback(self) -> Path | None:
        """The local folder that holds saves while the folder fails, or None."""
        if self._fallback == "auto":
            self._fallback = fallback_directory(self.directory)
        return self._fallback  # type: ignore[return-value]

    def _read(self) -> tuple[list[CheckpointInfo], list[str]]:
        """The checkpoints of the folder and of its fallback, oldest first, and the
        manifests that are not sound."""
        fallback = self.fallback
        return read_both(self.directory, fallback if fallback != self.directory else None)

    @_reading
    def list(self) -> list[CheckpointInfo]:
        """The checkpoints in the folder, oldest first, then the one being written, if any.

        Fast: manifests and file sizes only. ``status`` is "writing" for a save still in
        the background, "damaged" for a data file of the wrong size or one this process
        found failing its checksum, "complete" otherwise.
        """
        self._require_directory()
        pending = self._pending  # read first: its manifest may appear while listing
        infos = [info if integrity.problem(info, read=False) is None
                 else dataclasses.replace(info, status=catalog.DAMAGED)
                 for info in self._read()[0]]
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
        others = self._others_runs()
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
        info, payload = self._load_verified(which, map_location, unsafe_allow_pickle,
                                            best_by)
        restore(state, payload["state"], strict, payload.get("kinds"), payload.get("shapes"))
        if restore_rng:
            rng.restore_rng_states(payload.get("rng", {}))
        if info.run not in self._others_runs():
            leases.adopt(self.directory, info.run)  # later saves continue its run
        return info

    def _require_directory(self) -> None:
        fallback = self.fallback
        if not (self.directory.is_dir() or (fallback is not None and fallback.is_dir())):
            raise CheckpointError(f"no checkpoint folder at {self.directory}")

    def _load_verified(self, which: Which, map_location: Any, unsafe: bool,
                       best_by: tuple[str, str] | None) -> tuple[CheckpointInfo, dict[str, Any]]:
        """The newest candidate for ``which`` that verifies, with its loaded payload.

        The checksum is computed while torch reads the file (or known already: see
        ``integrity``), and nothing is restored unless it matches. An unsafe load runs the
        file's code, so it verifies first.
        """
        for info in self._candidates(which, best_by=best_by):
            if unsafe or integrity.trusted(info):
                problem = integrity.problem(info)
                if problem is None:
                    return info, _torch_load(info, map_location, unsafe)
            else:
                problem, (payload, failure) = side_by_side(
                    lambda: integrity.problem(info),  # noqa: B023 (waited for here)
                    lambda: _load_or_failure(info, map_location))  # noqa: B023
                if problem is None:
                    if failure is not None:
                        raise failure
                    return info, payload
            self._damaged(info, problem, which)
        raise CheckpointError(f"no valid checkpoint in {self.directory}")

    def _verified(self, which: Which,
                  damaged: Callable[[CheckpointInfo, str], object] | None = None
                  ) -> Iterator[CheckpointInfo]:
        """Candidates for ``which``, in order of preference, that pass verification.

        Each that fails goes to ``damaged(info, problem)``: by default a warning (or an
        error for a checkpoint named by ``which``); given one, nothing is warned.
        """
        for info in self._candidates(which, warn=damaged is None):
            problem = integrity.problem(info)
            if problem is None:
                yield info
            elif damaged is None:
                self._damaged(info, problem, which)
            else:
                damaged(info, problem)

    def _candidates(self, which: Which, *, warn: bool = True,
                    best_by: tuple[str, str] | None = None) -> Sequence[CheckpointInfo]:
        """Checkpoints matching ``which``, preferred first: for "latest" the newest, for
        "best" the best by the metric (of runs another live process writes only when there
        is no other); otherwise the newest."""
        found, unreadable = self._read()
        for name in unreadable if warn else ():
            warnings.warn(f"checkpoint manifest {name} in {self.directory} is unreadable; "
                          "skipping it", CheckpointWarning, stacklevel=4)
        infos = self._without_others(found) if which in ("latest", catalog.BEST) else found
        if which == catalog.BEST:
            metric, mode, _ = (self._best_rule(infos) if best_by is None
                               else _keep_best_rule(best_by))
            candidates = _ranked(infos, metric, mode)
            if not candidates:
                saved = ", ".join(sorted({key for info in infos for key in info.metrics}))
                raise CheckpointError(f"no checkpoint in {self.directory} has the metric "
                                      f"{metric!r} that 'best' is ranked by (metrics saved: "
                                      f"{saved or 'none'})")
        else:
            candidates = _candidates(infos, which)
        if not candidates and which != "latest":
            raise CheckpointError(_not_found(which, infos, self.directory))
        return candidates

    def _others_runs(self) -> dict[str, leases.Writer]:
        """The runs in the folder that another live process writes (not this one's)."""
        others = leases.live_elsewhere(self.directory)
        if self.fallback is not None:
            others |= leases.live_elsewhere(self.fallback)
        others.pop(leases.claimed(self.directory) or "", None)
        return others

    def live_writers(self) -> dict[str, leases.Writer]:
        """The runs in the folder that another live process on this machine writes, by run
        id (``CheckpointInfo.run``), with the process that writes each."""
        return self._others_runs()

    def _without_others(self, infos: Sequence[CheckpointInfo]) -> Sequence[CheckpointInfo]:
        """``infos`` less those of runs another live process writes, unless that leaves
        none (this process only reads the folder: its newest is what it asks for)."""
        others = self._others_runs()
        mine = [info for info in infos if info.run not in others]
        return mine or infos

    def _best_rule(self, infos: Sequence[CheckpointInfo]) -> tuple[str, str, int]:
        """This manager's keep_best, else the one the newest checkpoint was saved with."""
        if self.keep_best is not None:
            return self.keep_best
        recorded = next((info.keep_best for info in reversed(infos) if info.keep_best), None)
        saved = ", ".join(sorted({key for info in infos for key in info.metrics}))
        if recorded is None and not saved:
            raise worded(CheckpointError, "{best} ranks checkpoints by a metric, and no "
                         "checkpoint in {folder} has one: restore the latest, a step or a tag",
                         best="which='best'", folder=str(self.directory))
        if recorded is None:
            raise worded(CheckpointError, "{best} needs the metric to rank by: pass "
                         "{best_by}, as no checkpoint in {folder} was saved with a keep_best "
                         "rule (metrics saved: {saved})", best="which='best'",
                         best_by="best_by=(metric, 'min' or 'max')", folder=str(self.directory),
                         saved=saved)
        return _keep_best_rule(tuple(recorded))

    def _damaged(self, info: CheckpointInfo, problem: str, which: Which) -> None:
        """Skip a damaged checkpoint with a warning for "latest" and "best"; refuse it when
        named."""
        if which not in ("latest", catalog.BEST):
            raise CheckpointError(f"checkpoint {info.name} is damaged: {problem}")
        instead = "the previous one" if which == "latest" else "the next best"
        warnings.warn(f"checkpoint {info.name} in {self.directory} is damaged ({problem}); "
                      f"using {instead}", CheckpointWarning, stacklevel=4)


def check_keep_last(keep_last: int | None) -> None:
    """ValueError unless ``keep_last`` is a positive integer or None (keep all)."""
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                  or keep_last < 1):
        raise ValueError(f"keep_last must be a positive integer or None, not {keep_last!r}")


def default_directory(run: str, option: str = "directory=") -> Path:
    """``<persistent folder>/checkpoints/<run>`` for this platform; ``option`` is how the
    caller's reader names another folder (a magic: ``--dir``)."""
    from ipycloud.runtime.machine.platform import detect_platform

    platform = detect_platform()
    if platform.persistent_dir is None:
        warnings.warn(f"nothing survives a {platform.name} session: checkpoints go to "
                      f"{platform.scratch_dir}; download them or pass {option}",
                      CheckpointWarning, stacklevel=3)
        return platform.scratch_dir / "checkpoints" / run
    if not platform.persistent_dir.is_dir():
        raise CheckpointError(f"the persistent folder {platform.persistent_dir} of "
                              f"{platform.name} does not exist: mount it first, or pass "
                              f"{option}")
    return platform.persistent_dir / "checkpoints" / run


def _candidates(infos: Sequence[CheckpointInfo], which: Which) -> list[CheckpointInfo]:
    newest_first = list(reversed(infos))
    if which == "latest":  # the newest complete one, whatever the pointer says
        return newest_first
    if isinstance(which, int) and not isinstance(which, bool):
        return [info for info in newest_first if info.step == which]
    if isinstance(which, str):
        return [info for info in newest_first if which in (info.tag, info.name)]
    raise TypeError(f"which must be 'latest', a step or a tag, not {which!r}")


def _ranked(infos: Sequence[CheckpointInfo], metric: str, mode: str) -> list[CheckpointInfo]:
    """The checkpoints that recorded ``metric`` as a finite number, best first; of equals,
    the first to reach the value (as early stopping counts: only a strict improvement is
    one)."""
    scored = [info for info in infos if finite_number(info.metrics.get(metric))]
    return sorted(scored, key=lambda info: (info.metrics[metric] * (1 if mode == "min" else -1),
                                            info.sequence))


def _not_found(which: Which, infos: Sequence[CheckpointInfo], directory: Path) -> str:
    if isinstance(which, int):
        steps = ", ".join(str(info.step) for info in infos) or "none"
        return f"no checkpoint of step {which} in {directory} (steps saved: {steps})"
    tags = ", ".join(sorted({info.tag for info in infos if info.tag})) or "none"
    return f"no checkpoint tagged or named {which!r} in {directory} (tags: {tags})"


def _load_or_failure(info: CheckpointInfo,
                     map_location: Any) -> tuple[dict[str, Any], Exception | None]:
    """A safe load's payload, or the exception it raised (a damaged file raises too)."""
    try:
        return _torch_load(info, map_location, unsafe=False), None
    except Exception as error:
        return {}, error


def _torch_load(info: CheckpointInfo, map_location: Any, unsafe: bool) -> dict[str, Any]:
    torch = require("torch", "torch")
    if unsafe:
        warnings.warn(f"loading {info.data_path} with unsafe_allow_pickle=True: the file can "
                      "run any code it carries", CheckpointWarning, stacklevel=3)
        payload = torch.load(info.data_path, map_location=map_location, weights_only=False)
    else:
        try:
            payload = torch.load(info.data_path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            reason = _refusal_reason(str(error))
            raise UnsafeCheckpointError(
                f"refusing {info.data_path}: it holds objects a safe load does not allow "
                f"({reason}). Only if you made this file yourself, load it with "
                "unsafe_allow_pickle=True") from None
    if (not isinstance(payload, dict) or payload.get("format") != catalog.FORMAT
            or not isinstance(payload.get("state"), dict)):
        raise CheckpointError(f"{info.data_path} is not an ipycloud checkpoint")
    return payload


def _refusal_reason(message: str) -> str:
    """The sentence of torch's weights_only refusal that names what was refused."""
    found = re.search(r"WeightsUnpickler error: (.*?)(?: Please |\n|$)", message)
    if found:
        return found.group(1).strip()
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown reason"


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, not {step!r}")
    if step > catalog.MAX_STEP:
        raise ValueError(f"step must be at most {catalog.MAX_STEP} (checkpoint names hold "
                         f"nine digits), not {step}")


def _keep_best_rule(keep_best: tuple[Any, ...]) -> tuple[str, str, int]:
    """``(metric, mode, count)`` from ``(metric, mode[, count])``; ValueError otherwise."""
    parts = (*keep_best, 1) if isinstance(keep_best, tuple) and len(keep_best) == 2 else keep_best
    metric, mode, count = parts if isinstance(parts, tuple) and len(parts) == 3 else (None,) * 3
    if not isinstance(metric, str) or mode not in ("min", "max") or not (
            isinstance(count, int) and not isinstance(count, bool) and count >= 1):
        raise ValueError("keep_best is (metric, 'min' or 'max'[, count >= 1]), "
                         f"not {keep_best!r}")
    return metric, mode, count


def _metrics(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """Metrics as plain floats (tensors and NumPy scalars included), less those that are
    NaN or infinite: they rank nothing, and a manifest is strict JSON."""
    values = {}
    for key, value in (metrics or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {key!r} must be a number, not {value!r}") from None
        if finite_number(number):
            values[str(key)] = number
    return values


def _json_ready(value: Any, name: str) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be JSON data (finite numbers, strings, lists, dicts), "
                         f"not {value!r}") from None
    return value


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0], "ipycloud": __version__}
    for module in ("torch", "numpy", "torch_xla"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            versions[module] = getattr(loaded, "__version__", None)
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["cuda"] = torch.version.cuda
    return versions


_LIVE_MANAGERS: weakref.WeakSet[CheckpointManager] = weakref.WeakSet()
PRIORITY_TIMER_NAME = "ipycloud-save-priority"  # the thread that ends a save's idle priority


def _hurry_if_alive(manager: weakref.ref[CheckpointManager]) -> None:
    """Give a manager's background save normal priority, unless the manager is gone."""
    alive = manager()
    if alive is not None:
        alive._hurry()


def close_all(managers: Iterable[CheckpointManager]) -> None:
    """Close each manager (waiting for its saves); a failed save is reported, not lost."""
    _reporting_failures(manager.close for manager in managers)


@atexit.register
def _wait_for_writes_at_exit() -> None:
    """Interpreter exit waits for asynchronous saves; a failure is reported, not lost.

    The writer processes end by themselves once this process is gone.
    """
    _reporting_failures(manager.wait for manager in list(_LIVE_MANAGERS))


def _reporting_failures(calls: Iterable[Callable[[], object]]) -> None:
    for call in calls:
        try:
            call()
        except CheckpointError as error:
            print(f"ipycloud: {error}", file=sys.stderr)
