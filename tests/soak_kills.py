"""SIGKILL at random moments of checkpoint saves, and what a kill may and may not leave.

Kinds of kill (``KINDS``):

- "blocking": a process saving with ``blocking=True`` back to back is killed;
- "writer process": a process whose background saves (``blocking=False``, a state in host
  memory) the writer process writes, training meanwhile, is killed;
- "thread": the same with background saves written by a thread: the writer process's
  fallback where no interpreter can be started (``sys.executable`` missing), and
  ``background="thread"``, in turn;
- "writer killed": the writer process itself is killed during a write; the process it
  writes for lives on and saves again;
- "fit": ``ipycloud.fit`` with two DataLoader workers and periodic background saves is
  killed at a random step, two or three times over, then runs to its end.

Kills are timed from a seeded ``random.Random``: a uniform delay after the victim's first
acknowledged save (its writer then running), or a uniform step of a fit run. After each
kill, checked here rather than by the code under test where it can be:

- lost: the newest acknowledged checkpoint (the last step the killed process reported as
  saved) does not load, or does not hold that step's state, or "latest" loads an older
  one; for "fit", a resumed run starts before it;
- corrupt: a manifest whose data file fails its size or CRC-32 (``soak_folder``);
- committed after the kill: a checkpoint that appeared once its process was dead;
- left behind: after the next save, a temporary file or a data file without a manifest,
  or a process of the killed one still running past its deadline;
- for "fit": the final weights and optimizer state of the resumed runs equal, bit for bit,
  those of an uninterrupted run of the same seed, and every checkpoint loaded holds the
  weights that run had at that step.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from checkpoint_helpers import differences
from soak_folder import NOTHING_ON_DISK, inspect, landing
from soak_processes import Channel, Event, Started, Stray, Strays, Victim, reap_zombies
from soak_training import Training, checkpoint_digest, train

from ipycloud.runtime.checkpoint import CheckpointError, CheckpointManager

KINDS = ("blocking", "writer process", "thread", "writer killed", "fit")
THREAD_HOWS = ("no interpreter", "background='thread'")
KEEP_LAST = 2
SIZES = (1 << 12, 1 << 18, 1 << 22)  # float32 elements in a save: 16 kB, 1 MB, 16 MB
KILL_WINDOW_S = 0.6  # kills fall uniformly in this long after the first acknowledged save
WATCHDOG_S = 120.0  # the longest a victim may go without reporting
FIT_KILLS_PER_RUN = 3  # kills of one fit run before it is let finish
FIT_TRAININGS = (Training(seed=1), Training(seed=2, steps=44, every=5),
                 Training(seed=3, loader="2 persistent workers"))


@dataclass
class Kill:
    """One kill and what was found after it."""

    kind: str
    landed: str
    acknowledged: int | None  # the last step the killed process reported saved
    lost: str | None = None  # why the acknowledged checkpoint is lost, if it is
    corrupt: list[str] = field(default_factory=list)
    committed_after: list[str] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)  # files, then processes
    processes: dict[str, list[float]] = field(default_factory=dict)  # role: seconds to end
    resumed_equal: bool | None = None  # fit: the run's final state equals the reference
    how: str | None = None  # thread: which fallback wrote

    def failures(self) -> list[str]:
        found = [f"lost: {self.lost}"] if self.lost else []
        found += [f"corrupt: {item}" for item in self.corrupt]
        found += [f"committed after the kill: {item}" for item in self.committed_after]
        found += [f"left behind: {item}" for item in self.left_behind]
        if self.resumed_equal is False:
            found.append("the resumed run's final state differs from the uninterrupted run's")
        return found


def state_of(step: int) -> dict[str, torch.Tensor]:
    """The state saved as ``step``: its values (and size) follow from the step alone."""
    generator = torch.Generator().manual_seed(step)
    size = SIZES[step % len(SIZES)]
    return {"weights": torch.randn(size, generator=generator),
            "step": torch.tensor([step])}


def loaded_problem(manager: CheckpointManager, which: int | str) -> tuple[int | None, str | None]:
    """(step, None) when ``which`` loads and holds its step's state, else (step, why)."""
    try:
        info = manager.latest() if which == "latest" else None
        step = info.step if info is not None else which
        if not isinstance(step, int):
            return None, "no checkpoint verifies"
        restored = {name: torch.zeros_like(value) for name, value in state_of(step).items()}
        loaded = manager.load(restored, which=which, restore_rng=False)
    except CheckpointError as error:
        return None, f"{which} does not load: {error}"
    if loaded.step != step or differences(restored, state_of(step)):
        return loaded.step, f"{which} holds another state than step {loaded.step}'s"
    return step, None


class Soak:
    """Kills of every kind in one scratch folder, timed by one seeded generator."""

    def __init__(self, base: Path, seed: int, progress: Callable[[str], object] = print) -> None:
        self.base, self.rng, self.progress = base, random.Random(seed), progress
        self.logs = base / "logs"  # each victim's output
        self.strays = Strays()
        self.kills: list[Kill] = []
        self._left: list[tuple[Kill, list[Stray]]] = []  # each kill's processes, once ended
        self._write_s: dict[int, list[float]] = {}  # state size: seconds writes took

    def run(self, counts: dict[str, int]) -> list[Kill]:
        for kind in KINDS:
            if counts.get(kind):
                started, done = time.monotonic(), len(self.kills)
                {"writer killed": self.kill_writers,
                 "fit": self.kill_fits}.get(kind, self.kill_savers)(kind, counts[kind])
                self.progress(f"{kind}: {len(self.kills) - done} kills in "
                              f"{time.monotonic() - started:.0f} s")
        self.strays.finish()
        for kill, strays in self._left:
            self._note_processes(kill, strays)
        return self.kills

    # -- a process saving in a loop, killed ----------------------------------------------------

    def kill_savers(self, kind: str, count: int) -> None:
        folder = self.base / kind.replace(" ", "-")
        for index in range(count):
            how = THREAD_HOWS[index % 2] if kind == "thread" else None
            victim = Victim(_saving(folder, kind, how), f"{kind} saver {index}", self.logs)
            try:
                victim.wait_for(lambda event: event["event"] == "saved", WATCHDOG_S,
                                "its first save")
                self._read_for(victim, self.rng.uniform(0, KILL_WINDOW_S))
                left = victim.kill()
                victim.drain()
            finally:
                victim.close()
            writers = [started for started in left
                       if started.role(victim.pid, launches=False) == "writer process"]
            assert len(writers) == (kind == "writer process"), \
                f"{victim.label} ran {len(writers)} writer processes"
            kill = self._after_kill(kind, folder, victim, left, launches=False)
            kill.how = how
            self._check_next_save(kill, folder)
            reap_zombies()  # what it left ended as zombies, and met the next save so

    def _read_for(self, victim: Victim, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            victim.next_event(left)

    def _after_kill(self, kind: str, folder: Path, victim: Victim, left: list[Started],
                    launches: bool) -> Kill:
        """What the folder shows at once; what the killed process leaves, once it ended."""
        state = inspect(folder)
        landed = landing(state, KEEP_LAST)
        if landed == NOTHING_ON_DISK:
            last = victim.last_event() or {}
            landed = {"saving": "in a save, before any file", "staged": "training while "
                      "the save is written", "step": "training"}.get(last.get("event", ""),
                                                                       "between saves")
        acknowledged = max((event["step"] for event in victim.events
                            if event["event"] == "saved"), default=None)
        kill = Kill(kind, landed, acknowledged, corrupt=list(state.corrupt))
        strays = self.strays.add(victim, left, launches)
        self.strays.wait(strays)
        kill.committed_after = sorted(inspect(folder).manifests.keys() - state.manifests.keys())
        self._left.append((kill, strays))
        self.kills.append(kill)
        return kill

    def _note_processes(self, kill: Kill, strays: list[Stray]) -> None:
        for stray in strays:
            if stray.gone_after_s is not None:
                kill.processes.setdefault(stray.role, []).append(round(stray.gone_after_s, 3))
        kill.left_behind += [f"{stray.role} pid {stray.pid} ran past {stray.deadline_s:.0f} s "
                             "after the kill" for stray in self.strays.left_behind(strays)]

    def _check_next_save(self, kill: Kill, folder: Path) -> None:
        """Load the acknowledged and the latest checkpoint in another process, save the
        next step there, then look for leftovers."""
        outcome = _in_victim(_checking(folder, kill.acknowledged, save_next=True),
                             f"check after {kill.kind} kill", self.logs)
        kill.lost = outcome["lost"]
        state = inspect(folder)
        kill.corrupt += [item for item in state.corrupt if item not in kill.corrupt]
        kill.left_behind += state.left_behind

    # -- the writer process killed, its process living on --------------------------------------

    def kill_writers(self, kind: str, count: int) -> None:
        folder = self.base / "writer-killed"
        victim = Victim(_saving_on_command(folder), "saver whose writer is killed",
                        self.logs)
        try:
            self._save_once(victim)  # starts the writer process
            for _ in range(count):
                self._save_once(victim, timed=True)  # how long a write takes
                self._kill_writer_once(kind, folder, victim)
        finally:
            victim.send("stop")
            victim.join(WATCHDOG_S)  # (not to hide what raised)
            victim.close()

    def _save_once(self, victim: Victim, timed: bool = False) -> Event:
        """One background save; with ``timed``, by a running writer, its time is noted."""
        victim.send("save")
        staged = victim.wait_for(lambda event: event["event"] == "staged", WATCHDOG_S,
                                 "a background save")
        started = time.monotonic()
        outcome = victim.wait_for(lambda event: event["event"] in ("saved", "failed"),
                                  WATCHDOG_S, "the save's outcome")
        if timed and outcome["event"] == "saved":
            size = SIZES[staged["step"] % len(SIZES)]
            self._write_s.setdefault(size, []).append(time.monotonic() - started)
        return outcome

    def _kill_writer_once(self, kind: str, folder: Path, victim: Victim) -> None:
        writers = [started for started in victim.started()
                   if started.role(victim.pid, launches=False) == "writer process"]
        assert len(writers) == 1, f"expected one writer process, found {writers}"
        writer = writers[0].process
        victim.send("save")
        staged = victim.wait_for(lambda event: event["event"] == "staged", WATCHDOG_S,
                                 "a background save")
        size = SIZES[staged["step"] % len(SIZES)]
        typical = statistics.median(self._write_s.get(size, [0.05]))
        time.sleep(self.rng.uniform(0, 1.5 * typical))
        writer.kill()
        outcome = victim.wait_for(lambda event: event["event"] in ("saved", "failed"),
                                  WATCHDOG_S, "the save's outcome")
        state = inspect(folder)
        if outcome["event"] == "saved":
            landed = "after its write: the save succeeded"
        elif any(name.startswith(f".tmp-{writer.pid}-") for name in state.temporaries):
            landed = "during its write: the save failed, its temporary file left"
        else:
            landed = "during its write: the save failed, before any file"
        acknowledged = max((event["step"] for event in victim.events
                            if event["event"] == "saved"), default=None)
        kill = Kill(kind, landed, acknowledged, corrupt=list(state.corrupt))
        self.kills.append(kill)
        outcome = _in_victim(_checking(folder, acknowledged, save_next=False),
                             "check after a writer kill", self.logs)
        kill.lost = outcome["lost"]
        after = self._save_once(victim)  # the next save: a new writer process
        if after["event"] != "saved":
            kill.lost = f"the next save failed too: {after.get('error')}"
        state = inspect(folder)
        kill.corrupt += [item for item in state.corrupt if item not in kill.corrupt]
        kill.left_behind += state.left_behind
        if writer.is_running() and writer.status() != "zombie":
            kill.left_behind.append(f"killed writer process pid {writer.pid} still running")

    # -- fit, killed at random steps and resumed -------------------------------------------------

    def kill_fits(self, kind: str, count: int) -> None:
        references: dict[Training, Reference] = {}
        run = 0
        while count > 0:
            training = FIT_TRAININGS[run % len(FIT_TRAININGS)]
            if training not in references:
                references[training] = Reference.of(training, self.base / f"reference-{run}",
                                                    self.logs)
            killed = self._kill_fit_run(kind, training, references[training],
                                        self.base / f"fit-{run}", min(count, FIT_KILLS_PER_RUN))
            reap_zombies()  # what the kills left ended as zombies, and met the resumed runs so
            count -= killed
            run += 1

    def _kill_fit_run(self, kind: str, training: Training, reference: Reference,
                      folder: Path, kills: int) -> int:
        """Kill one run up to ``kills`` times, then let it finish; returns the kills made."""
        mine: list[tuple[Kill, list[str]]] = []  # each kill and what it left at once
        for attempt in range(kills):
            victim = Victim(lambda channel: train(training, folder, channel, None),
                            f"fit run {folder.name}, attempt {attempt}", self.logs)
            try:
                left = self._kill_at_random_step(victim, training)
                self._check_resumed_from(victim, mine)
            finally:
                victim.close()
            if left is None:  # it finished first
                break
            kill = self._after_kill(kind, folder, victim, left, launches=False)
            kill.lost = kill.lost or self._check_fit_checkpoints(kill, training, reference,
                                                                 folder)
            mine.append((kill, inspect(folder).left_behind))
        result = folder.parent / f"{folder.name}-final.pt"
        final = Victim(lambda channel: train(training, folder, channel, result),
                       f"fit run {folder.name}, to its end", self.logs)
        try:
            final.wait_for(lambda event: event["event"] == "finished", WATCHDOG_S * 3,
                           "the end of training")
            final.exit_within(WATCHDOG_S)
            self._check_resumed_from(final, mine)
        finally:
            final.close()
        equal = not differences(torch.load(result, weights_only=True), reference.final)
        state = inspect(folder)
        for kill, at_once in mine:  # what the kill left and the resumed runs did not remove
            kill.resumed_equal = equal
            kill.left_behind += [name for name in at_once if name in state.left_behind]
            kill.corrupt += [item for item in state.corrupt if item not in kill.corrupt]
        if mine:
            seen = {name for _, at_once in mine for name in at_once}
            mine[-1][0].left_behind += [name for name in state.left_behind if name not in seen]
        return len(mine)

    def _kill_at_random_step(self, victim: Victim, training: Training) -> list[Started] | None:
        """Kill the run at a uniform step after its first acknowledged checkpoint; None if
        it finished before."""
        try:
            saved = victim.wait_for(lambda event: event["event"] == "saved", WATCHDOG_S,
                                    "its first checkpoint")
        except AssertionError:
            if victim.ended() and any(event["event"] == "finished" for event in victim.events):
                return None
            raise
        if saved["step"] + 1 >= training.steps:
            return None
        target = self.rng.randint(saved["step"] + 1, training.steps - 1)
        reached = victim.wait_for(lambda event: event["event"] == "finished" or (
            event["event"] == "step" and event["step"] >= target), WATCHDOG_S, f"step {target}")
        if reached["event"] == "finished":  # the acknowledgement came after that step
            return None
        time.sleep(self.rng.uniform(0, 0.01))
        left = victim.kill()
        victim.drain()
        return left

    def _check_resumed_from(self, victim: Victim, kills: list[tuple[Kill, list[str]]]) -> None:
        """A resumed run's first step follows the last kill's acknowledged checkpoint."""
        steps = [event["step"] for event in victim.events if event["event"] == "step"]
        if not kills or not steps:
            return
        kill = kills[-1][0]
        if kill.acknowledged is not None and steps[0] - 1 < kill.acknowledged:
            kill.lost = kill.lost or (f"the resumed run started after step {steps[0] - 1}, "
                                      f"before step {kill.acknowledged} acknowledged")

    def _check_fit_checkpoints(self, kill: Kill, training: Training, reference: Reference,
                               folder: Path) -> str | None:
        outcome = _in_victim(_fit_checking(training, folder, kill.acknowledged),
                             "check after a fit kill", self.logs)
        for step, digest in outcome["loaded"]:
            if reference.digests.get(step) != digest:
                return f"the checkpoint of step {step} holds other weights than the " \
                       "uninterrupted run had at that step"
        return outcome["lost"]


@dataclass
class Reference:
    """An uninterrupted run: its weights digest after each step and its final state."""

    digests: dict[int, str]
    final: dict[str, Any]

    @classmethod
    def of(cls, training: Training, folder: Path, logs: Path) -> Reference:
        result = folder.parent / f"{folder.name}-final.pt"
        victim = Victim(lambda channel: train(training, folder, channel, result, digests=True),
                        f"uninterrupted run {folder.name}", logs)
        try:
            victim.wait_for(lambda event: event["event"] == "finished", WATCHDOG_S * 3,
                            "the end of training")
            victim.exit_within(WATCHDOG_S)
        finally:
            victim.close()
        digests = {event["step"]: event["digest"] for event in victim.events
                   if event["event"] == "step"}
        return cls(digests, torch.load(result, weights_only=True))


# -- what the victims and checkers run (in forked children) -----------------------------------

def _saving(folder: Path, kind: str, how: str | None) -> Callable[[Channel], None]:
    def body(channel: Channel) -> None:
        if how == "no interpreter":
            sys.executable = str(folder / "no python here")  # the writer process cannot start
        manager = CheckpointManager(folder, keep_last=KEEP_LAST,
                                    background="thread" if how == THREAD_HOWS[1] else "auto")
        step = manager.next_step()
        state = state_of(step)
        while True:
            channel.report("saving", step=step)
            if kind == "blocking":
                manager.save(state, step=step)
                channel.report("saved", step=step)
                state = state_of(step + 1)  # the training between saves
            else:
                manager.save(state, step=step, blocking=False)
                channel.report("staged", step=step)
                state = state_of(step + 1)  # the training, while the save is written
                manager.wait()
                channel.report("saved", step=step)
            step += 1

    return body


def _saving_on_command(folder: Path) -> Callable[[Channel], None]:
    def body(channel: Channel) -> None:
        manager = CheckpointManager(folder, keep_last=KEEP_LAST)
        step = manager.next_step()
        while channel.command() == "save":
            manager.save(state_of(step), step=step, blocking=False)
            channel.report("staged", step=step)
            try:
                manager.wait()
            except CheckpointError as error:
                channel.report("failed", step=step, error=str(error))
            else:
                channel.report("saved", step=step)
            step += 1
        manager.close()

    return body


def _checking(folder: Path, acknowledged: int | None,
              save_next: bool) -> Callable[[Channel], None]:
    def body(channel: Channel) -> None:
        manager = CheckpointManager(folder, keep_last=KEEP_LAST)
        lost = None
        if acknowledged is not None:
            _, lost = loaded_problem(manager, acknowledged)
            latest, problem = loaded_problem(manager, "latest")
            lost = lost or problem
            if latest is not None and latest < acknowledged:
                lost = lost or f"latest loads step {latest}, older than step {acknowledged}"
        if save_next:
            step = manager.next_step()
            manager.save(state_of(step), step=step)
        channel.report("checked", lost=lost)

    return body


def _fit_checking(training: Training, folder: Path,
                  acknowledged: int | None) -> Callable[[Channel], None]:
    def body(channel: Channel) -> None:
        loaded, lost = [], None
        if acknowledged is not None:
            try:
                loaded.append(checkpoint_digest(training, folder, acknowledged))
                loaded.append(checkpoint_digest(training, folder, "latest"))
            except CheckpointError as error:
                lost = f"a checkpoint does not load: {error}"
            if len(loaded) == 2 and loaded[1][0] < acknowledged:
                lost = f"latest loads step {loaded[1][0]}, older than step {acknowledged}"
        channel.report("checked", lost=lost, loaded=loaded)

    return body


def _in_victim(body: Callable[[Channel], None], label: str, logs: Path) -> Event:
    """Run ``body`` in a forked child to its end; its "checked" event."""
    victim = Victim(body, label, logs)
    try:
        event = victim.wait_for(lambda event: event["event"] == "checked", WATCHDOG_S,
                                "its check")
        victim.exit_within(WATCHDOG_S)
    finally:
        victim.close()
    return event


def summary(kills: list[Kill]) -> dict[str, Any]:
    """Counts by kind: kills, where they landed, lost, corrupt, left behind, resumed equal."""
    kinds: dict[str, Any] = {}
    for kill in kills:
        row = kinds.setdefault(kill.kind, {
            "kills": 0, "landed": {}, "lost": 0, "corrupt": 0, "committed_after_kill": 0,
            "left_behind": 0, "resumed_equal": 0, "resumed_compared": 0, "exit_s": {}})
        row["kills"] += 1
        row["landed"][kill.landed] = row["landed"].get(kill.landed, 0) + 1
        row["lost"] += kill.lost is not None
        row["corrupt"] += len(kill.corrupt)
        row["committed_after_kill"] += len(kill.committed_after)
        row["left_behind"] += len(kill.left_behind)
        if kill.resumed_equal is not None:
            row["resumed_compared"] += 1
            row["resumed_equal"] += kill.resumed_equal
        for role, seconds in kill.processes.items():
            row["exit_s"].setdefault(role, []).extend(seconds)
    for row in kinds.values():
        row["exit_s"] = {role: {"count": len(seconds), "max": max(seconds),
                                "median": statistics.median(seconds)}
                         for role, seconds in row["exit_s"].items()}
    return kinds


def as_records(kills: list[Kill]) -> list[dict[str, Any]]:
    return [asdict(kill) for kill in kills]
