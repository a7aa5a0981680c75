"""Soak: ``fit`` trains on through storage faults injected at random moments, hundreds of times.

Goals, for each kind of fault, over RUNS runs that each get one fault:

1. No training run crashes: ``fit`` returns, and its model and optimizer equal those of a
   run without checkpoints bit for bit (it trained on exactly). A fault that lands before
   the first step, while ``fit`` reads its folder for a checkpoint to resume from, makes it
   refuse to start (CheckpointStorageError, nothing trained), by design: it cannot know
   what the folder holds, and starting afresh could bury a run's progress under newer
   checkpoints. Such runs count apart ("refused to start"): they are rerun once the folder
   answers, as the user would rerun the cell, and that rerun must train exactly.
2. No run hangs: each runs under a watchdog (``faulthandler.dump_traceback_later(HANG_S,
   exit=True)`` in a worker process); a worker that ends without a run's result is a hang,
   reported with the case and its threads' stacks, and a new worker goes on at the next case.
3. The newest checkpoint anywhere (the folder or its fallback folder) loads and verifies,
   in every run: after the run (after healing, for a run still failing at its end), with the
   process state reset so that every checksum is read again, a fresh CheckpointManager of
   the folder loads "latest"; it must be the newest checkpoint found on disk (see 4), of the
   run's last step, and equal the trained model and optimizer bit for bit. The same load
   before healing is reported beside it (a folder that cannot be read cannot be loaded
   from: ``fit`` refuses to start then, by design).
4. The folder is at most one checkpoint behind once it answers again. After every optimizer
   step, and after ``fit`` returns, the manifests of the folder (read in its backing folder,
   around the mount, so that reading neither fails nor meets the faults) and of the
   fallback folder are scanned; with keep_last=3 and a save every EVERY steps, each
   checkpoint the run commits is seen before rotation removes it. "Behind", at a scan, is
   how many of the run's committed checkpoints, wherever they are, are newer (by the save
   time in their manifest, which a copy keeps) than the newest the folder holds. The folder
   "answers again" at the first scan after the heal at which it holds a checkpoint whose
   save began after the heal (saved there, or copied back from the fallback folder); from
   then on, at every scan, behind must be at most 1. Before that, once the run has saved
   since the heal, the first copy back is under way: behind then (all the saves made while
   the folder failed, plus that one) and the time from the heal to the answer are
   reported. At the end of a run healed while it ran and saved since, behind must be 0
   (``fit`` waits for the last copy back). A run that ended unhealed is healed, then
   ``fit`` is run again on the folder (it finds the run complete): behind after that rerun
   must be 0 (a copy back that never happens leaves the run's result on the scratch disk
   only).
5. The warnings: a run's CheckpointWarnings are one for each kind of failure ("saving into
   ... failed: ..."; the kind is the error's strerror), one for the move ("... failed 2
   saves in a row ...") and one for the way back ("... answers again ..."), and nothing
   else; a checkpoint in the fallback folder was always told; a run that moved and saved
   after healing tells the way back. The run's last line ("the newest checkpoint is step S,
   in FOLDER") must name the step and the folder where the newest is on disk.
6. The cost: the time ``fit`` takes with the fault, beside runs without one in the same
   worker (every BASELINE_EVERY-th case; not counted among the faults).

The kinds, and the operations each fails (tests/faultfs.py, a real FUSE mount):

- ENOTCONN: every operation (what a Drive mount whose connection dropped answers);
- EIO: read, write, flush (close) and fsync: the operations that move data;
- ENOSPC: create, mkdir, write, flush and fsync: those that take space;
- EROFS: every operation that changes something (create, write, rename, unlink, mkdir,
  link, setattr);
- vanished: the file system's process is killed, so that every access, through open
  descriptors too, fails with ENOTCONN, then it mounts again (``come_back``);
- full: a tmpfs of FULL_DISK is filled with zeros until a write fails; healing deletes the
  filler.

For EIO and ENOSPC half the runs (drawn) fail all of the kind's operations, half only one
of them that every save meets (drawn; not mkdir, met only by the first). Each run trains a
small CNN (38k parameters, Adam: 0.46 MB checkpoints) with a DataLoader and validation for
EPOCHS epochs of STEPS_PER_EPOCH steps, saving every EVERY steps into a fresh folder. The
fault starts at a moment drawn uniformly over the first INJECT_BEFORE (70%) of a fault-free
run's duration with the same threads (measured by the worker first), counted from the call
of ``fit``; it is healed a time drawn in HEAL_AFTER (5% to 60% of that duration) later,
or, in NEVER_HEALED (20%) of the runs, only after ``fit`` returns (a heal drawn past the
run's end is one too). A fault the run ended before is drawn again, so that each kind gets
RUNS faults. Half the runs (drawn) use one torch thread, so that saves are written in the
background by the writer process (``blocking="auto"`` on a machine of two cores or more),
half use every core (saves written at once). Every draw comes from SEED.

Run: ``python benchmarks/soak_faults.py [--runs N] [--seed S] [--kinds K ...]``; needs
FUSE (scripts/test_fuse.sh) and root or passwordless sudo for the tmpfs. Results go to
``benchmarks/results/soak_faults.json``: per kind, the figures and every run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import faulthandler
import io
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from ipycloud.runtime.train.callback import Callback

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import torch  # noqa: E402
from checkpoint_helpers import differences  # noqa: E402
from faultfs import (  # noqa: E402
    CHANGING,
    FaultyMount,
    as_root,
    fuse_missing,
    mount_points,
    mounted,
)
from faultfs_daemon import unmount_lazily  # noqa: E402
from figures import distribution, write_soak  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from ipycloud.runtime.checkpoint import CheckpointError, CheckpointManager  # noqa: E402
from ipycloud.runtime.checkpoint.errors import (  # noqa: E402
    CheckpointStorageError,
    CheckpointWarning,
)
from ipycloud.runtime.checkpoint.fallback import fallback_directory  # noqa: E402
from ipycloud.runtime.per_process import reset_process_state  # noqa: E402
from ipycloud.runtime.train.loop import fit  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "soak_faults.json"
KINDS = ("ENOTCONN", "EIO", "ENOSPC", "EROFS", "vanished", "full")
OPERATIONS: dict[str, frozenset[str] | None] = {
    "ENOTCONN": None,  # every operation
    "EIO": frozenset({"read", "write", "flush", "fsync"}),
    "ENOSPC": frozenset({"create", "mkdir", "write", "flush", "fsync"}),
    "EROFS": CHANGING,
}
# Of these, the one operation that fails alone in half the runs (drawn): each is met by
# every save. A read-only or disconnected file system fails all of its at once.
ALONE = {"EIO": ("read", "write", "flush", "fsync"), "ENOSPC": ("create", "write", "flush",
                                                                "fsync")}
RUNS = 100  # faults of each kind
SEED = 20261125
NEVER_HEALED = 0.2  # the share of runs healed only after fit returns
INJECT_BEFORE = 0.7  # faults start in this first share of a fault-free run's duration
HEAL_AFTER = (0.05, 0.6)  # and are healed this share of it later (drawn uniformly)
BASELINE_EVERY = 10  # every so many cases is a run without a fault
CALIBRATION_RUNS = 2  # fault-free runs of each thread count that time a worker's runs
REMOUNT_TRIES = 5  # a vanished mount's mount point may be written to as it comes back
HANG_S = 120.0  # a run that takes longer is a hang (fit waits at most 30 s for a copy back)
WORKER_LIMIT_S = 3600.0
FULL_DISK = "24m"
STEPS_PER_EPOCH, EPOCHS, EVERY, BATCH = 10, 2, 3, 32
CLASSES, SIDE = 10, 16
ERRORS = (errno.ENOTCONN, errno.EIO, errno.ENOSPC, errno.EROFS)


# -- the training run -------------------------------------------------------------------------

def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small CNN and its Adam optimizer, always initialised alike."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Dropout(0.1), nn.Linear(32 * (SIDE // 4) ** 2, 64), nn.ReLU(),
        nn.Linear(64, CLASSES))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def loaders() -> tuple[DataLoader, DataLoader]:
    """Images whose class is a fixed linear rule of their pixels; training and validation."""
    generator = torch.Generator().manual_seed(1)
    count = STEPS_PER_EPOCH * BATCH
    images = torch.randn(count + 128, 1, SIDE, SIDE, generator=generator)
    labels = (images.flatten(1) @ torch.randn(SIDE * SIDE, CLASSES,
                                              generator=generator)).argmax(dim=1)
    return (DataLoader(TensorDataset(images[:count], labels[:count]), batch_size=BATCH,
                       shuffle=True),
            DataLoader(TensorDataset(images[count:], labels[count:]), batch_size=64))


def train(folder: Path | None, callbacks: list[Any]) -> dict[str, Any]:
    """One ``fit``; the trained model's and optimizer's states."""
    model, optimizer = build()
    train_data, val_data = loaders()
    fit(model, optimizer, train_data, epochs=EPOCHS, val_data=val_data, device="cpu",
        checkpoint=folder, checkpoint_every_steps=EVERY, seed=7, callbacks=callbacks)
    return copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})


# -- storage that fails -----------------------------------------------------------------------

class Storage(Protocol):
    """Where a kind of fault is injected and healed."""

    path: Path  # where checkpoint folders are made
    backing: Path  # the same files, read around the faults

    def inject(self, case: dict[str, Any]) -> None: ...

    def heal(self) -> None: ...

    def take_bare_writes(self) -> list[str]: ...


class FaultyStorage:
    """A faultfs mount: an errno on chosen operations, or the mount vanishing."""

    def __init__(self, mount: FaultyMount) -> None:
        self.mount, self.path, self.backing = mount, mount.path, mount.backing
        self._vanished = False
        self._bare_writes: list[str] = []

    def inject(self, case: dict[str, Any]) -> None:
        if case["kind"] == "vanished":
            self.mount.vanish()
            self._vanished = True
        else:
            self.mount.fail(getattr(errno, case["kind"]), ops=case["operations"])

    def heal(self) -> None:
        if not self._vanished:
            self.mount.heal()
            return
        for _ in range(REMOUNT_TRIES):
            try:
                self.mount.come_back()
            except RuntimeError as error:
                if "not empty" not in str(error):
                    raise
                self._clear_bare_mount_point()
            else:
                self._vanished = False
                return
        raise RuntimeError(f"{self.path} could not be mounted again in {REMOUNT_TRIES} tries")

    def _clear_bare_mount_point(self) -> None:
        """What was written into the mount point while nothing was mounted on it: the
        mount would hide it (and FUSE refuses to mount over it); noted, then deleted."""
        for child in list(self.path.iterdir()):
            self._bare_writes += [str(path.relative_to(self.path))
                                  for path in [child, *child.rglob("*")]]
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()

    def take_bare_writes(self) -> list[str]:
        """The paths written into the bare mount point since the last call."""
        taken, self._bare_writes = self._bare_writes, []
        return taken


class FullDisk:
    """A small tmpfs made really full by a file of zeros."""

    def __init__(self, path: Path) -> None:
        self.path = self.backing = path
        self.filler = path / "filler"

    def inject(self, case: dict[str, Any]) -> None:
        descriptor = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        zeros = bytes(1 << 20)
        try:
            while os.write(descriptor, zeros):
                pass
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
        finally:
            os.close(descriptor)

    def heal(self) -> None:
        self.filler.unlink(missing_ok=True)

    def take_bare_writes(self) -> list[str]:
        return []  # never unmounted


class Fault(threading.Thread):
    """Injects a case's fault ``inject_s`` after the start, heals it ``heal_s`` later
    (never, for None), unless the run has ended by then."""

    def __init__(self, storage: Storage, case: dict[str, Any], base_s: float) -> None:
        super().__init__(name="soak-fault", daemon=True)
        self.storage, self.case = storage, case
        self.inject_s = case["inject_at"] * base_s
        self.heal_s = None if case["heal_after"] is None else case["heal_after"] * base_s
        self.ended = threading.Event()
        self.injected_at: float | None = None  # time.time() of the injection
        self.healed_at: float | None = None  # of the heal
        self.error: str | None = None  # why injecting or healing failed

    def run(self) -> None:
        try:
            if self.ended.wait(self.inject_s):
                return
            self.storage.inject(self.case)
            self.injected_at = time.time()
            if self.heal_s is None or self.ended.wait(self.heal_s):
                return
            self.storage.heal()
            self.healed_at = time.time()
        except Exception as error:  # told in the run's record
            self.error = f"{type(error).__name__}: {error}"


# -- what the run left on disk ----------------------------------------------------------------

def manifests(folder: Path) -> list[dict[str, Any]]:
    """The checkpoint manifests in ``folder`` now (none where it cannot be read)."""
    found = []
    with contextlib.suppress(OSError):
        for path in folder.glob("step-*.json"):
            with contextlib.suppress(OSError, ValueError):
                found.append(json.loads(path.read_text()))
    return found


class Watcher(Callback):
    """Every checkpoint the run commits, where it lies, and how far the folder is behind;
    a callback of ``fit`` that scans after every optimizer step."""

    def __init__(self, backing: Path, fallback: Path, fault: Fault | None) -> None:
        self.backing, self.fallback, self.fault = backing, fallback, fault
        self.saves: dict[tuple[int, float], set[str]] = {}  # (step, time) -> places
        self.in_folder: set[tuple[int, float]] = set()  # as of the last scan
        self.answered: float | None = None  # when the folder held a save begun after healing
        self.catching_up: list[int] = []  # behind, after a save since healing, before that
        self.behind_samples: list[int] = []  # behind, from then on
        self.steps = 0  # optimizer steps ended

    def scan(self) -> None:
        self.in_folder = set()
        for place, folder in (("folder", self.backing), ("fallback", self.fallback)):
            for manifest in manifests(folder):
                key = (manifest["step"], manifest["time"])
                self.saves.setdefault(key, set()).add(place)
                if place == "folder":
                    self.in_folder.add(key)

    def behind(self) -> int:
        """How many committed checkpoints are newer than the folder's newest."""
        newest = max((saved for _, saved in self.in_folder), default=float("-inf"))
        return sum(saved > newest for _, saved in self.saves)

    def newest(self) -> tuple[int, float] | None:
        return max(self.saves, key=lambda key: (key[1], key[0]), default=None)

    def saved_after_heal(self, where: set[tuple[int, float]] | None = None) -> bool:
        """Whether a checkpoint whose save began after the heal is committed (``where``:
        among these)."""
        healed = self.fault.healed_at if self.fault is not None else None
        return healed is not None and any(saved >= healed for _, saved in (
            self.saves if where is None else where))

    def sample(self) -> None:
        """Scan, and note how far behind the folder is once it answers again."""
        self.scan()
        if self.answered is None and self.saved_after_heal(self.in_folder):
            self.answered = time.time()
        if self.answered is not None:
            self.behind_samples.append(self.behind())
        elif self.saved_after_heal():
            self.catching_up.append(self.behind())

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        self.steps += 1
        self.sample()


def told(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(warning.message) for warning in caught
            if issubclass(warning.category, CheckpointWarning)]


def classify(messages: list[str]) -> dict[str, Any]:
    """The run's warnings by what they tell: failures (by kind), the move, the way back."""
    failures: list[str] = []
    moves = backs = 0
    others = []
    for text in messages:
        told_something = False
        if " failed: " in text:
            failure = text.split(" failed: ", 1)[1]
            failures.append(next((errno.errorcode[number] for number in ERRORS
                                  if os.strerror(number) in failure), "other"))
            told_something = True
        if re.search(r" failed \d+ saves in a row", text):
            moves += 1
            told_something = True
        if " answers again: " in text:
            backs += 1
            told_something = True
        if not told_something:
            others.append(text)
    return {"failures": failures, "moves": moves, "backs": backs, "others": others,
            "texts": messages}


LAST_LINE = re.compile(r"ipycloud\.fit: the newest checkpoint is step (\d+), in (.+?)"
                       r"(?: on this machine only: .*)?$")


def last_line_problem(output: str, watcher: Watcher, folder: Path, last_step: int) -> str | None:
    """Why the run's last line does not name the newest checkpoint where it lies."""
    lines = [line for line in output.splitlines() if LAST_LINE.search(line)]
    newest = watcher.newest()
    if not lines or newest is None:
        return "no line names the newest checkpoint"
    found = LAST_LINE.search(lines[-1])
    assert found is not None
    where = "folder" if newest in watcher.in_folder else "fallback"
    said = "folder" if Path(found[2]) == folder else "fallback"
    if int(found[1]) != last_step or said != where:
        return f"the last line says step {found[1]} in the {said}, the newest is step " \
               f"{newest[0]} in the {where}: {lines[-1]}"
    return None


def newest_loads(folder: Path, trained: dict[str, Any], newest: tuple[int, float] | None,
                 last_step: int) -> str | None:
    """Why the newest checkpoint does not load, verify and equal the trained state, or
    None. With the process state reset, every checksum is read again."""
    reset_process_state()
    model, optimizer = build()
    try:
        info = CheckpointManager(folder).load({"model": model, "optimizer": optimizer},
                                              strict=False, restore_rng=False)
    except CheckpointError as error:
        return f"{type(error).__name__}: {error}"
    if (info.step, info.time) != newest or info.step != last_step:
        return (f"loaded step {info.step} saved at {info.time} from {info.directory}; the "
                f"newest on disk is {newest}, the last step {last_step}")
    wrong = differences({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                        trained)
    return f"differs from the trained state at {wrong[:3]}" if wrong else None


def quietly(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()`` with its output and warnings dropped."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return run()


# -- a worker: runs the cases of one kind in one process --------------------------------------

class Worker:
    """Runs cases of one kind in this process, each under the watchdog, and appends a JSON
    line to ``out`` as each starts and ends."""

    def __init__(self, storage: Storage, cases: list[dict[str, Any]], out: Path) -> None:
        self.storage, self.cases, self.out = storage, cases, out
        self.expected: dict[int, dict[str, Any]] = {}  # by threads: the state fit reaches
        self.base_s: dict[int, float] = {}  # by threads: a fault-free run's duration
        self.last_step = STEPS_PER_EPOCH * EPOCHS

    def write(self, record: dict[str, Any]) -> None:
        with open(self.out, "a") as results:
            results.write(json.dumps(record) + "\n")

    def warm_up(self) -> None:
        """The state each thread count trains to, and how long a fault-free run takes with
        each (a first run warms up)."""
        seconds: dict[int, list[float]] = {}
        for threads in (1, os.cpu_count() or 1):
            torch.set_num_threads(threads)
            self.expected[threads] = train(None, [])
            seconds[threads] = [self.run_case({"index": -1, "kind": None, "baseline": True,
                                               "threads": threads})["fit_s"]
                                for _ in range(CALIBRATION_RUNS + 1)][1:]
            self.base_s[threads] = statistics.median(seconds[threads])
        self.write({"calibration_s": seconds})

    def run(self, first: int) -> None:
        self.warm_up()
        for case in self.cases[first:]:
            self.write({"started": case["index"]})
            faulthandler.dump_traceback_later(HANG_S, exit=True, file=sys.stderr.fileno())
            record = self.run_case(case)
            faulthandler.cancel_dump_traceback_later()
            self.write(record)

    def run_case(self, case: dict[str, Any]) -> dict[str, Any]:
        torch.set_num_threads(case["threads"])
        folder = self.storage.path / "MyDrive" / f"case {case['index']}"  # as on Drive
        backing = self.storage.backing / "MyDrive" / f"case {case['index']}"
        fallback = fallback_directory(folder)
        fault = (None if case["baseline"]
                 else Fault(self.storage, case, self.base_s[case["threads"]]))
        watcher = Watcher(backing, fallback, fault)
        record: dict[str, Any] = {**case, "crash": None}
        output = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            warnings.simplefilter("always")
            started = time.monotonic()
            if fault is not None:
                fault.start()
            try:
                trained = train(folder, [watcher])
            except Exception as error:  # a crash: what the soak looks for
                if isinstance(error, CheckpointStorageError) and not watcher.steps:
                    record["refused_at_start"] = str(error)  # by design (see goal 1)
                else:
                    record["crash"] = f"{type(error).__name__}: {error}"
                trained = {}
            record["fit_s"] = round(time.monotonic() - started, 4)
            if fault is not None:
                fault.ended.set()
                fault.join()
        watcher.sample()
        record.update(warnings=classify(told(caught)), behind_samples=watcher.behind_samples,
                      catching_up=watcher.catching_up, behind_end=watcher.behind(),
                      saves=len(watcher.saves),
                      in_fallback=sum("fallback" in places for places in watcher.saves.values()))
        if record["crash"] is None and trained:
            wrong = differences(trained, self.expected[case["threads"]])
            record["trained_exactly"] = not wrong
            record["last_line"] = last_line_problem(output.getvalue(), watcher, folder,
                                                    self.last_step)
        if fault is not None:
            self.after_fault(record, fault, watcher, folder, trained)
        else:
            record["newest_loads"] = newest_loads(folder, trained, watcher.newest(),
                                                  self.last_step)
        reset_process_state()
        shutil.rmtree(backing, ignore_errors=True)
        shutil.rmtree(fallback, ignore_errors=True)
        record["case_s"] = round(time.monotonic() - started, 4)
        return record

    def after_fault(self, record: dict[str, Any], fault: Fault, watcher: Watcher,
                    folder: Path, trained: dict[str, Any]) -> None:
        """Heal a fault still in force, then check the newest and the copy back."""
        record["injected"] = fault.injected_at is not None
        record["fault_error"] = fault.error
        record["healed_during_run"] = fault.healed_at is not None
        record["saved_after_heal"] = watcher.saved_after_heal()
        record["answered_s"] = (None if watcher.answered is None or fault.healed_at is None
                                else round(watcher.answered - fault.healed_at, 4))
        record["bare_mount_point_writes"] = self.storage.take_bare_writes()
        still_failing = fault.injected_at is not None and fault.healed_at is None
        if still_failing:
            record["loads_while_failing"] = newest_loads(folder, trained, watcher.newest(),
                                                         self.last_step)
            self.storage.heal()
            record["bare_mount_point_writes"] += self.storage.take_bare_writes()
        if "refused_at_start" in record:  # the user reruns the cell once the folder answers
            trained = quietly(lambda: train(folder, [watcher]))
            watcher.scan()  # the final save
            record["rerun_trained_exactly"] = not differences(
                trained, self.expected[record["threads"]])
        record["newest_loads"] = newest_loads(folder, trained, watcher.newest(),
                                              self.last_step)
        if record["behind_end"] and record["crash"] is None:
            quietly(lambda: train(folder, []))
            watcher.scan()
            record["behind_after_rerun"] = watcher.behind()


def worker_main(spec_path: Path, out: Path, first: int) -> None:
    spec = json.loads(spec_path.read_text())
    with storage_for(spec["kind"], Path(spec["base"])) as storage:
        Worker(storage, spec["cases"], out).run(first)


@contextlib.contextmanager
def storage_for(kind: str, base: Path) -> Iterator[Storage]:
    if kind == "full":
        yield FullDisk(base / "small disk")
        return
    # a mount point of its own: a worker stopped by its watchdog may leave a dead mount
    with mounted(base / "backing", base / f"My Drive {os.getpid()}") as mount:
        yield FaultyStorage(mount)


# -- the soak: cases, workers, figures --------------------------------------------------------

class Cases:
    """The cases of one kind, drawn from the seed: faults, and every BASELINE_EVERY-th a
    run without one."""

    def __init__(self, kind: str, seed: int) -> None:
        self.kind, self.draw = kind, random.Random(f"{seed}-{kind}")
        self.cases: list[dict[str, Any]] = []

    def more(self, faults: int) -> None:
        """Draw ``faults`` more fault cases (and the fault-free ones among them)."""
        cores = os.cpu_count() or 1
        while faults:
            case: dict[str, Any] = {"index": len(self.cases), "kind": self.kind,
                                    "threads": self.draw.choice((1, cores))}
            if len(self.cases) % BASELINE_EVERY == BASELINE_EVERY - 1:
                self.cases.append({**case, "baseline": True})
                continue
            operations = OPERATIONS.get(self.kind)  # None: every operation, or no errno
            chosen = None if operations is None else (
                [self.draw.choice(ALONE[self.kind])]
                if self.kind in ALONE and self.draw.random() < 0.5 else sorted(operations))
            self.cases.append({**case, "baseline": False, "operations": chosen,
                               "inject_at": round(self.draw.uniform(0.0, INJECT_BEFORE), 4),
                               "heal_after": None if self.draw.random() < NEVER_HEALED
                               else round(self.draw.uniform(*HEAL_AFTER), 4)})
            faults -= 1


def soak_kind(kind: str, runs: int, seed: int, base: Path) -> dict[str, Any]:
    """Run cases in workers until ``runs`` faults were injected (one that a run ended
    before is drawn again), a new worker after a hang; every record, and the hangs."""
    cases = Cases(kind, seed)
    records: dict[int, dict[str, Any]] = {}
    hangs: list[dict[str, Any]] = []
    calibrations: list[Any] = []
    while (missing := runs - sum(bool(record.get("injected")) for record in records.values())
           - sum(not hang["case"]["baseline"] for hang in hangs)) > 0:
        first: int | None = len(cases.cases)
        cases.more(missing)
        while first is not None:
            first = run_worker(kind, cases.cases, first, base, records, hangs, calibrations)
    return {"records": [records[index] for index in sorted(records)], "hangs": hangs,
            "calibrations": calibrations}


def run_worker(kind: str, cases: list[dict[str, Any]], first: int, base: Path,
               records: dict[int, dict[str, Any]], hangs: list[dict[str, Any]],
               calibrations: list[Any]) -> int | None:
    """One worker over ``cases`` from ``first``, its results added to ``records``; where
    it ended without a case's result, that case is a hang (its watchdog fired) or a crash
    and the index to go on from is returned."""
    spec, out, log = (base / f"{kind}.{suffix}" for suffix in ("json", "results", "log"))
    spec.write_text(json.dumps({"kind": kind, "base": str(base), "cases": cases}))
    with open(log, "w") as log_file:
        worker = subprocess.run(
            [sys.executable, __file__, "--worker", str(spec), str(out), str(first)],
            stdout=log_file, stderr=subprocess.STDOUT, timeout=WORKER_LIMIT_S)
    started = None
    for line in out.read_text().splitlines() if out.exists() else []:
        entry = json.loads(line)
        if "started" in entry:
            started = entry["started"]
        elif "calibration_s" in entry:
            calibrations.append(entry["calibration_s"])
        elif entry["index"] >= 0:
            records[entry["index"]] = entry
            started = None
    out.unlink(missing_ok=True)
    if started is None:
        if worker.returncode != 0:
            raise RuntimeError(f"the {kind} worker failed outside a run: "
                               f"{log.read_text()[-3000:]}")
        return None
    text = log.read_text(errors="replace")
    watchdog = "Timeout (" in text
    hangs.append({"case": cases[started], "exit_code": worker.returncode,
                  "watchdog": watchdog, "log_tail": text[-6000:]})
    print(f"  {kind} case {started}: {'hang' if watchdog else 'crash'} (exit "
          f"{worker.returncode}); a new worker goes on", flush=True)
    return started + 1 if started + 1 < len(cases) else None


def warnings_problem(record: dict[str, Any]) -> str | None:
    """How a run's warnings break the rule (see goal 5), or None."""
    told_ = record["warnings"]
    kinds = Counter(told_["failures"])
    if any(count > 1 for count in kinds.values()):
        return f"a kind of failure told more than once: {dict(kinds)}"
    if record["in_fallback"] and not kinds:
        return "a checkpoint went to the fallback folder untold"
    if told_["moves"] > 1 or told_["backs"] > told_["moves"]:
        return f"{told_['moves']} moves, {told_['backs']} ways back"
    if told_["moves"] and record.get("healed_during_run") and record.get(
            "saved_after_heal") and not told_["backs"]:
        return "moved, healed and saved since, but the way back was not told"
    if told_["others"]:
        return f"other warnings: {told_['others']}"
    return None


def summary(soaked: dict[str, Any]) -> dict[str, Any]:
    """The figures of one kind's runs (see the goals)."""
    records = soaked["records"]
    baselines = [record for record in records if record["baseline"]]
    injected = [record for record in records if record.get("injected")]
    healed = [record for record in injected if record["healed_during_run"]]
    saved_since = [record for record in healed if record["saved_after_heal"]]
    answered = [record for record in healed if record["behind_samples"]]
    unhealed = [record for record in injected if not record["healed_during_run"]]
    patterns = Counter(f"{len(record['warnings']['failures'])} failure, "
                       f"{record['warnings']['moves']} move, {record['warnings']['backs']} back"
                       for record in injected)

    def cases(problem: str) -> list[dict[str, Any]]:
        return [{"case": record["index"], "problem": record[problem]} for record in records
                if record.get(problem)]

    return {
        "faults_injected": len(injected), "healed_during_run": len(healed),
        "saved_after_heal": len(saved_since), "answered_during_run": len(answered),
        "ended_unhealed": len(unhealed),
        "no_save_met_the_fault": sum(not record["warnings"]["failures"]
                                     and not record["in_fallback"] for record in injected),
        "crashes": cases("crash") + [{"case": hang["case"]["index"], "problem": "the worker "
                                      f"died (exit {hang['exit_code']})"}
                                     for hang in soaked["hangs"] if not hang["watchdog"]],
        "hangs": [hang["case"] for hang in soaked["hangs"] if hang["watchdog"]],
        "refused_at_start": [record["index"] for record in records
                             if "refused_at_start" in record],
        "rerun_after_refusal_not_exact": [record["index"] for record in records
                                          if record.get("rerun_trained_exactly") is False],
        "not_trained_exactly": [record["index"] for record in records
                                if record.get("trained_exactly") is False],
        "newest_unloadable": cases("newest_loads"),
        "newest_loads_while_failing": sum(record.get("loads_while_failing") is None
                                          for record in unhealed),
        "wrong_last_line": cases("last_line"),
        "behind_once_answered_max": distribution(
            [float(max(record["behind_samples"])) for record in answered]),
        "behind_more_than_1": [record["index"] for record in answered
                               if max(record["behind_samples"]) > 1],
        "behind_while_catching_up_max": distribution(
            [float(max(record["catching_up"])) for record in healed if record["catching_up"]]),
        "answered_s": distribution([record["answered_s"] for record in answered]),
        "healed_behind_at_end": [record["index"] for record in saved_since
                                 if record["behind_end"]],
        "unhealed_behind_at_end": dict(sorted(Counter(
            record["behind_end"] for record in unhealed).items())),
        "copy_back_never_happens": [record["index"] for record in injected
                                    if record.get("behind_after_rerun")],
        "bare_mount_point_writes": cases("bare_mount_point_writes"),
        "fault_errors": cases("fault_error"),
        "warning_patterns": dict(patterns.most_common()),
        "warning_rule_broken": [{"case": record["index"], "problem": problem}
                                for record in injected
                                if (problem := warnings_problem(record)) is not None],
        "fit_s": {f"{threads} threads": durations(
            [record for record in injected if record["threads"] == threads],
            [record for record in baselines if record["threads"] == threads])
            for threads in sorted({record["threads"] for record in records})},
    }


def durations(faulty: list[dict[str, Any]], fault_free: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """How long fit took with a fault and without, and the ratio of the medians."""
    with_fault = [record["fit_s"] for record in faulty]
    without = [record["fit_s"] for record in fault_free]
    return {"with_fault": distribution(with_fault), "without": distribution(without),
            "median_ratio": round(statistics.median(with_fault) / statistics.median(without),
                                  3) if with_fault and without else None}


def print_summary(kind: str, figures: dict[str, Any]) -> None:
    print(f"{kind:9s} {figures['faults_injected']} faults, {figures['ended_unhealed']} "
          f"unhealed at the end: crashes {len(figures['crashes'])}, hangs "
          f"{len(figures['hangs'])}, newest unloadable {len(figures['newest_unloadable'])}, "
          f"not trained exactly {len(figures['not_trained_exactly'])}; refused to start "
          f"{len(figures['refused_at_start'])} (reruns not exact "
          f"{len(figures['rerun_after_refusal_not_exact'])})")
    print(f"          folder behind once it answered: max "
          f"{figures['behind_once_answered_max'].get('max')} in "
          f"{figures['answered_during_run']} runs (>1 in {len(figures['behind_more_than_1'])}),"
          f" {figures['answered_s'].get('median')} s from the heal (median); healed runs "
          f"behind at the end {len(figures['healed_behind_at_end'])}; copy back never "
          f"happens {len(figures['copy_back_never_happens'])}; written into the bare mount "
          f"point {len(figures['bare_mount_point_writes'])}")
    print(f"          warnings {figures['warning_patterns']}; rule broken in "
          f"{len(figures['warning_rule_broken'])}; wrong last line "
          f"{len(figures['wrong_last_line'])}")
    for threads, seconds in figures["fit_s"].items():
        print(f"          fit on {threads}: {seconds['with_fault'].get('median')} s with the "
              f"fault (p90 {seconds['with_fault'].get('p90')}), "
              f"{seconds['without'].get('median')} s without: x{seconds['median_ratio']}")
    sys.stdout.flush()


@contextlib.contextmanager
def small_disk(base: Path) -> Iterator[None]:
    """A tmpfs of FULL_DISK at base/"small disk", for the runs of a really full disk."""
    root = as_root()
    if root is None:
        sys.exit("soak_faults: mounting a tmpfs needs root or passwordless sudo")
    target = base / "small disk"
    target.mkdir()
    subprocess.run([*root, "mount", "-t", "tmpfs", "-o",
                    f"size={FULL_DISK},uid={os.getuid()},gid={os.getgid()},mode=0700",
                    "tmpfs", str(target)], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([*root, "umount", "--lazy", str(target)], check=True,
                       capture_output=True, timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="faults of each kind")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON to write")
    parser.add_argument("--worker", nargs=3, metavar=("SPEC", "OUT", "FIRST"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec, out, first = args.worker
        worker_main(Path(spec), Path(out), int(first))
        return
    if reason := fuse_missing():
        sys.exit(f"soak_faults: {reason}")
    began, load_before = time.monotonic(), os.getloadavg()[0]
    results: dict[str, Any] = {"settings": {
        "runs_per_kind": args.runs, "seed": args.seed, "never_healed": NEVER_HEALED,
        "baseline_every": BASELINE_EVERY, "hang_s": HANG_S, "full_disk": FULL_DISK,
        "steps_per_epoch": STEPS_PER_EPOCH, "epochs": EPOCHS, "checkpoint_every_steps": EVERY,
        "batch": BATCH, "operations": {kind: sorted(ops) if ops else "all"
                                       for kind, ops in OPERATIONS.items()}},
        "kinds": {}}
    with tempfile.TemporaryDirectory(prefix="ipycloud-soak-faults-", dir="/var/tmp") as name:
        base = Path(name)
        (base / "scratch").mkdir()  # the scratch disk: fallback folders go there
        os.environ.update(TMPDIR=str(base / "scratch"), XDG_STATE_HOME=str(base / "state"))
        try:
            with small_disk(base):
                for kind in args.kinds:
                    soaked = soak_kind(kind, args.runs, args.seed, base)
                    figures = summary(soaked)
                    print_summary(kind, figures)
                    results["kinds"][kind] = {"figures": figures, **soaked}
        finally:
            for mount_point in mount_points():  # left by a worker its watchdog stopped
                if mount_point.is_relative_to(base):
                    unmount_lazily(str(mount_point))
    write_soak(results, args.out, began, load_before, "/var/tmp")


if __name__ == "__main__":
    main()
