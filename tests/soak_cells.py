"""The soak matrix: each DataLoader x save mode x number of processes, killed and resumed.

A cell (a ``soak_training.Training``) is trained three times: once uninterrupted; once in
another folder, killed with SIGKILL at a uniform random step after its first acknowledged
checkpoint; and once more in that folder, resuming, to its end. The resumed run must start
at or after the acknowledged checkpoint and end bitwise equal (model and optimizer) to the
uninterrupted one. Under ``launch`` the process killed is the one that launched (a
notebook's kernel): its ranks must end with it and write nothing after it. Whatever a
kill leaves (ranks, DataLoader workers, the writer process) must end within its deadline,
and the folder must hold no temporary or orphan file and no corrupt checkpoint at the end.

Every run is under a watchdog: one that reports nothing for WATCHDOG_S seconds is a hang,
a failure that names the cell and the run, with its threads' stacks; its processes are
killed and the next cell runs.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from checkpoint_helpers import differences
from soak_folder import inspect
from soak_processes import Event, Strays, Victim, VictimEnded, VictimError, VictimHang
from soak_training import LOADERS, SAVES, Training, train

WATCHDOG_S = 120.0
CELLS = tuple(Training(loader=loader, save=save, processes=processes)
              for processes in (1, 2) for save in SAVES for loader in LOADERS)


@dataclass
class CellResult:
    """What one cell did and what went wrong in it."""

    cell: str
    seed: int
    killed_at_step: int | None = None
    acknowledged: int | None = None  # the last step reported saved before the kill
    resumed_from: int | None = None  # the step the resumed run started after
    equal: bool | None = None  # the resumed run's final state equals the uninterrupted one's
    processes: dict[str, list[float]] = field(default_factory=dict)  # role: seconds to end
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_cell(training: Training, base: Path, rng: random.Random) -> CellResult:
    """Run one cell in ``base`` (its own folder); never raises for what the cell does."""
    result = CellResult(training.describe(), training.seed)
    started = time.monotonic()
    strays = Strays()
    logs = base / "logs"
    try:
        reference = _run_to_end(training, base / "uninterrupted", logs, "the uninterrupted run")
        folder = base / "killed"
        _kill_at_random_step(training, folder, logs, rng, strays, result)
        resumed = _run_to_end(training, folder, logs, "the resumed run", result)
        result.equal = not differences(resumed, reference)
        if not result.equal:
            result.failures.append("the resumed run's final state differs from the "
                                   "uninterrupted run's")
        state = inspect(folder)
        result.failures += [f"corrupt: {item}" for item in state.corrupt]
        result.failures += [f"left behind: {name}" for name in state.left_behind]
    except (VictimHang, VictimEnded, VictimError) as error:
        result.failures.append(str(error))
    strays.finish()
    for stray in strays.watched:
        if stray.gone_after_s is not None:
            result.processes.setdefault(stray.role, []).append(round(stray.gone_after_s, 3))
    result.failures += [f"left behind: {stray.role} pid {stray.pid} ran past "
                        f"{stray.deadline_s:.0f} s after the kill"
                        for stray in strays.left_behind()]
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _run_to_end(training: Training, folder: Path, logs: Path, what: str,
                result: CellResult | None = None) -> dict[str, Any]:
    """Train in ``folder`` to the end; the final state (and where a resumed run began)."""
    final = folder.parent / f"{folder.name}-final-{time.monotonic_ns()}.pt"
    victim = Victim(lambda channel: train(training, folder, channel, final),
                    f"{training.describe()}: {what}", logs)
    try:
        victim.wait_for(lambda event: event["event"] == "finished", WATCHDOG_S, "its end")
        victim.exit_within(WATCHDOG_S)
    finally:
        victim.close()
    steps = [event["step"] for event in victim.events if event["event"] == "step"]
    if result is not None and steps:
        result.resumed_from = steps[0] - 1
        if result.acknowledged is not None and result.resumed_from < result.acknowledged:
            result.failures.append(f"the resumed run started after step {result.resumed_from}"
                                   f", before step {result.acknowledged} acknowledged")
    state: dict[str, Any] = torch.load(final, weights_only=True)
    return state


def _kill_at_random_step(training: Training, folder: Path, logs: Path, rng: random.Random,
                         strays: Strays, result: CellResult) -> None:
    victim = Victim(lambda channel: train(training, folder, channel, None),
                    f"{training.describe()}: the run killed", logs)
    try:
        saved = victim.wait_for(lambda event: event["event"] == "saved", WATCHDOG_S,
                                "its first checkpoint")
        if saved["step"] + 1 >= training.steps:
            raise VictimEnded(f"{victim.label} acknowledged no checkpoint before its end")
        target = rng.randint(saved["step"] + 1, training.steps - 1)
        victim.wait_for(lambda event: event["event"] == "step" and event["step"] >= target,
                        WATCHDOG_S, f"step {target}")
        time.sleep(rng.uniform(0, 0.01))
        left = victim.kill()
        victim.drain()  # what it wrote before it died
        result.killed_at_step = max(event["step"] for event in victim.events
                                    if event["event"] == "step")
        result.acknowledged = max(event["step"] for event in victim.events
                                  if event["event"] == "saved")
        killed_events, before = len(victim.events), inspect(folder).manifests.keys()
        strays.wait(strays.add(victim, left, launches=training.processes > 1))
        victim.drain()  # what its processes wrote since
        result.failures += _after_the_kill(victim.events[killed_events:], before,
                                           inspect(folder).manifests.keys())
    finally:
        victim.close()


def _after_the_kill(events: list[Event], before: Any, after: Any) -> list[str]:
    """What the killed run's processes did once it was dead: report steps, commit
    checkpoints."""
    failures = []
    steps = [event["step"] for event in events if event["event"] == "step"]
    if steps:
        failures.append(f"its processes trained on after the kill, to step {max(steps)}")
    committed = sorted(after - before)
    if committed:
        failures.append(f"checkpoints committed after the kill: {', '.join(committed)}")
    return failures


def summary(results: list[CellResult]) -> dict[str, Any]:
    return {"cells_run": len(results),
            "passed": sum(not result.failures for result in results),
            "resumed_equal": sum(bool(result.equal) for result in results),
            "hangs": sum(any("reported nothing" in failure or "did not exit" in failure
                             for failure in result.failures) for result in results)}


__all__ = ["CELLS", "LOADERS", "SAVES", "CellResult", "run_cell", "summary"]
