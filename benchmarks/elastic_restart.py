"""Benchmark: from a worker's death to ``fit``'s first new step after torchrun restarts the
group, and the work lost, against the checkpoint interval.

Two ``ipycloud torchrun`` agents on this machine stand in for two nodes (c10d rendezvous
on 127.0.0.1, 2 processes each: world size 4, gloo on the CPU; tests/local_nodes.py
starts them). The group runs elastic_restart_worker.py: ``fit`` of a 6.3 MB MLP (with
AdamW, a 19 MB checkpoint; some 100 ms a step here) with a checkpoint every
``checkpoint_every`` steps. Each configuration (``checkpoint_every`` 10, 40 and 160 steps
with torchrun's default --monitor-interval of 0.1 s, and 40 steps with a monitor interval
of 1 s) starts the agents, then KILLS times: waits until the group has taken a number of
steps past where it resumed drawn from ``checkpoint_every + 1`` to twice that (seeded: a
save has begun, and the kill lands anywhere in the next interval), kills one worker with
SIGKILL (ranks 1, 2, 3 in turn; the first rank writes the checkpoints), and waits for
every rank of the new group to take a step.

Each kill is split, from the worker timeline (tests' style: each process notes the wall
time of what it reached) and the run record the first rank writes, into:

- stopping: until every worker of the old group has ended (this process polls them);
- rendezvous: until the first worker of the new group is created;
- imports: until every new worker has imported torch (torch._dynamo too: building an
  optimizer imports it) and ipycloud's loop, the interpreter's start included;
- process group: until every rank is through ``init_process_group``;
- script: until the first rank calls ``fit`` (the script builds its model and data);
- fit load: until the run record's start line (DDP wraps the model, the first rank
  chooses and loads the checkpoint, the others load the one it chose);
- settle: until the pass that settles DDP's buckets is over (the vote's gloo group is
  made and the first batch fetched on the way; none in a group that starts afresh);
- first step: until the first rank ends its first new optimizer step.

Work lost: the steps between the checkpoint the new group resumed from and the last
step any rank ended before the kill, and their time at the old group's pace. Beside it,
the newest checkpoint the first rank had begun to save before the kill (a save runs in
the background, at idle priority for 2 s at most), and whether the old first rank's run record
got its end line (a rank that ends by itself writes it; one cut short does not).

Run: ``python benchmarks/elastic_restart.py [--quick]`` (about 6 minutes; ``--quick``:
intervals 10 and 40, two kills each, about 2 minutes); results go to
``benchmarks/results/elastic_restart.json``, every kill in it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from elastic_cases import CASES, HERE, NODES, PROCESSES_PER_NODE, ROOT, agents_environment
from figures import distribution, machine, write_results

sys.path.insert(0, str(ROOT / "tests"))

from local_nodes import LocalNodes, wait_for
from soak_processes import subreaper

RESULTS = HERE / "results" / "elastic_restart.json"
WORKER = HERE / "elastic_restart_worker.py"
CASE = "mlp"
# (checkpoint_every, torchrun's --monitor-interval): torchrun's default interval, 0.1 s, at
# three checkpoint intervals, and a slower monitor at one of them
CONFIGURATIONS = ((10, 0.1), (40, 0.1), (160, 0.1), (40, 1.0))
QUICK_CONFIGURATIONS = ((10, 0.1), (40, 0.1))
DEFAULT_MONITOR_INTERVAL_S = 0.1
KILLS, QUICK_KILLS = 3, 2
LAST_CALL_TIMEOUT_S = 2  # the rendezvous' wait for more agents once it has enough
SEED = 2026
POLL_S = 0.02
START_TIMEOUT_S = 180  # four workers import torch on two cores
RESTART_TIMEOUT_S = 180
PHASES = ("stopping", "rendezvous", "imports", "process_group", "script", "fit_load",
          "settle", "first_step")


class Timeline:
    """The marks the workers append to ``folder/<pid>.jsonl``, read as they grow."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.marks: list[dict[str, Any]] = []
        self._read: dict[Path, int] = {}

    def update(self) -> list[dict[str, Any]]:
        for path in self.folder.glob("*.jsonl"):
            with open(path, "rb") as file:
                file.seek(self._read.get(path, 0))
                text = file.read()
            whole = text[:text.rfind(b"\n") + 1]  # a line being written waits
            self._read[path] = self._read.get(path, 0) + len(whole)
            self.marks += [json.loads(line) for line in whole.splitlines()]
        return self.marks

    def group(self, since: float) -> dict[int, int]:
        """The ranks (rank: pid) of the workers created after ``since`` that have
        initialised their process group."""
        created = {mark["pid"] for mark in self.marks
                   if mark["mark"] == "created" and mark["t"] > since}
        return {mark["rank"]: mark["pid"] for mark in self.marks
                if mark["mark"] == "group" and mark["pid"] in created}

    def last_step(self, pids: set[int]) -> int:
        return max((mark["step"] for mark in self.marks
                    if mark["mark"] == "step" and mark["pid"] in pids), default=0)

    def first_step(self, pid: int) -> dict[str, Any] | None:
        return next((mark for mark in self.marks
                     if mark["pid"] == pid and mark["mark"] == "step"), None)


def _new_group(timeline: Timeline, since: float, nodes: LocalNodes,
               timeout: float) -> dict[int, int]:
    """The new group's ranks once every one of them has taken a step."""
    def stepped() -> bool:
        timeline.update()
        group = timeline.group(since)
        return len(group) == NODES * PROCESSES_PER_NODE and all(
            timeline.first_step(pid) for pid in group.values())

    wait_for(stepped, timeout, "a step of every rank of the new group", nodes)
    return timeline.group(since)


def _wait_for_step(timeline: Timeline, pid: int, step: int, nodes: LocalNodes) -> None:
    def reached() -> bool:
        timeline.update()
        return timeline.last_step({pid}) >= step

    wait_for(reached, RESTART_TIMEOUT_S, f"step {step}", nodes)


def _wait_for_record(folder: Path, pid: int, nodes: LocalNodes) -> None:
    """Wait for the start line of ``pid``'s run record (a thread writes it)."""
    def written() -> bool:
        return any(line["kind"] == "start" and line["writer"] == pid
                   for line in _records(folder))

    wait_for(written, RESTART_TIMEOUT_S, f"the run record of {pid}", nodes)


def _ended(pids: list[int]) -> dict[int, float]:
    """Wait for ``pids`` to end; when each was first seen ended (wall time)."""
    ended: dict[int, float] = {}
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while len(ended) < len(pids):
        for pid in pids:
            if pid not in ended and not _alive(pid):
                ended[pid] = time.time()
        if time.monotonic() > deadline:
            raise AssertionError(f"workers {sorted(set(pids) - set(ended))} did not end "
                                 f"in {RESTART_TIMEOUT_S} s")
        time.sleep(POLL_S)
    return ended


def _alive(pid: int) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


def run_configuration(every: int, monitor_s: float, kills: int, rng: random.Random,
                      base: Path) -> dict[str, Any]:
    """Start the agents, kill a worker ``kills`` times; the raw facts of each kill."""
    folder, timeline_dir = base / "checkpoints", base / "timeline"
    timeline_dir.mkdir(parents=True)
    timeline = Timeline(timeline_dir)
    done: list[dict[str, Any]] = []
    with LocalNodes(WORKER, [str(folder), str(timeline_dir), str(every), CASE],
                    base / "logs", max_restarts=kills,
                    environment=agents_environment(base / "state"),
                    monitor_interval=monitor_s,
                    last_call_timeout=LAST_CALL_TIMEOUT_S) as nodes:
        group = _new_group(timeline, 0.0, nodes, START_TIMEOUT_S)
        for index in range(kills):
            pids = set(group.values())
            start = timeline.first_step(group[0])
            assert start is not None
            target = start["step"] - 1 + rng.randint(every + 1, 2 * every)
            _wait_for_step(timeline, group[0], target, nodes)
            victim = 1 + index % 3
            os.kill(group[victim], signal.SIGKILL)
            killed_at = time.time()
            ended = _ended(list(pids))
            new = _new_group(timeline, killed_at, nodes, RESTART_TIMEOUT_S)
            _wait_for_record(folder, new[0], nodes)
            done.append({"killed_at": killed_at, "victim_rank": victim, "old": group,
                         "ended": ended, "new": new,
                         "old_resumed_from": start["step"] - 1})
            group = new
    return {"kills": done, "marks": timeline.update(), "records": _records(folder)}


def _records(folder: Path) -> list[dict[str, Any]]:
    """Every line of the run records in ``folder``, each with the pid of the process that
    wrote it (that of the start line before it in its log)."""
    lines = []
    for log in sorted((folder / ".ipycloud-runs").glob("*.jsonl")):
        pid = None
        text = log.read_text()
        for written in text[:text.rfind("\n") + 1].splitlines():  # a line being written waits
            line = json.loads(written)
            pid = line.get("pid", pid) if line["kind"] == "start" else pid
            lines.append({**line, "writer": pid})
    return lines


def split(kill: dict[str, Any], marks: list[dict[str, Any]], records: list[dict[str, Any]],
          every: int) -> dict[str, Any]:
    """One kill's phases (seconds) and the work it lost."""
    def at(pid: int, what: str) -> float:
        return min(mark["t"] for mark in marks if mark["pid"] == pid and mark["mark"] == what)

    killed_at = kill["killed_at"]
    old, new = kill["old"], kill["new"]
    first = new[0]
    start_line = next(line for line in records
                      if line["kind"] == "start" and line["writer"] == first)
    first_step = min((mark for mark in marks if mark["pid"] == first and mark["mark"] == "step"),
                     key=lambda mark: mark["t"])
    settled = [mark["t"] for mark in marks if mark["pid"] == first and mark["mark"] == "settled"]
    first_steps = {mark["pid"]: mark["step"] for mark in reversed(marks) if mark["mark"] == "step"}
    points = {
        "stopping": max(kill["ended"].values()),
        "rendezvous": min(at(pid, "created") for pid in new.values()),
        "imports": max(at(pid, "imported") for pid in new.values()),
        "process_group": max(at(pid, "group") for pid in new.values()),
        "script": at(first, "fit"),
        "fit_load": start_line["t"],
        "settle": settled[0] if settled else start_line["t"],
        "first_step": first_step["t"],
    }
    phases, previous = {}, killed_at
    for phase in PHASES:
        phases[phase] = points[phase] - previous
        previous = points[phase]
    old_steps = sorted(mark["t"] for mark in marks
                       if mark["pid"] == old[0] and mark["mark"] == "step")
    step_s = statistics.median(b - a for a, b in itertools.pairwise(old_steps[3:]))
    last = max(mark["step"] for mark in marks if mark["mark"] == "step"
               and mark["pid"] in old.values() and mark["t"] <= killed_at)
    resumed_from = first_step["step"] - 1
    begun = kill["old_resumed_from"] + (last - kill["old_resumed_from"]) // every * every
    rank0_end = any(line["kind"] == "end" and line["writer"] == old[0] for line in records)
    return {"victim_rank": kill["victim_rank"], "phases_s": phases,
            "to_first_step_s": first_step["t"] - killed_at,
            "old_rank0_ended_s": kill["ended"][old[0]] - killed_at,
            "last_step_before_kill": last, "resumed_from": resumed_from,
            "newest_save_begun": begun if begun > kill["old_resumed_from"] else None,
            "lost_steps": last - resumed_from, "step_s": step_s,
            "lost_work_s": (last - resumed_from) * step_s,
            "old_rank0_record_ended": rank0_end,
            "new_ranks_first_steps": sorted({first_steps[pid] for pid in new.values()})}


def summarise(every: int, monitor_s: float, kills: list[dict[str, Any]],
              checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one configuration."""
    phases = {phase: distribution([kill["phases_s"][phase] for kill in kills])
              for phase in PHASES}
    medians = {phase: figures["median"] for phase, figures in phases.items()}
    in_flight_lost = [kill for kill in kills if kill["newest_save_begun"] is not None
                      and kill["resumed_from"] < kill["newest_save_begun"]
                      and not kill["old_rank0_record_ended"]]
    return {
        "checkpoint_every": every, "monitor_interval_s": monitor_s, "kills": len(kills),
        "to_first_step_s": distribution([kill["to_first_step_s"] for kill in kills]),
        "phases_s": phases, "dominant_phase": max(medians, key=lambda phase: medians[phase]),
        "lost_steps": distribution([float(kill["lost_steps"]) for kill in kills]),
        "lost_work_s": distribution([kill["lost_work_s"] for kill in kills]),
        "back_where_it_was_s": distribution([kill["to_first_step_s"] + kill["lost_work_s"]
                                             for kill in kills]),
        "step_s": statistics.median(kill["step_s"] for kill in kills),
        "checkpoint_reported_after_s": distribution(
            [line["after_s"] for line in checkpoints]),
        "saves_in_flight_lost": len(in_flight_lost),
        "ranks_agree_on_first_step": all(len(kill["new_ranks_first_steps"]) == 1
                                         for kill in kills),
        "every_kill": kills,
    }


def _reported_after(marks: list[dict[str, Any]],
                    records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each checkpoint line of the record: how long after its step it was reported
    written (fit reports a background save once it finds it done)."""
    reported = []
    for line in records:
        if line["kind"] != "checkpoint":
            continue
        ends = [mark["t"] for mark in marks if mark["pid"] == line["writer"]
                and mark["mark"] == "step" and mark["step"] == line["step"]]
        if ends:
            reported.append({"step": line["step"], "after_s": line["t"] - ends[0]})
    return reported


def lines(summary: dict[str, Any]) -> list[str]:
    """One line a figure."""
    every = f"every {summary['checkpoint_every']} steps"
    if summary["monitor_interval_s"] != DEFAULT_MONITOR_INTERVAL_S:
        every += f", --monitor-interval={summary['monitor_interval_s']:g}"
    total = summary["to_first_step_s"]
    said = ", ".join(f"{phase.replace('_', ' ')} {figures['median']:.2f}"
                     for phase, figures in summary["phases_s"].items())
    lost, lost_s, back = (summary["lost_steps"], summary["lost_work_s"],
                          summary["back_where_it_was_s"])
    reported = summary["checkpoint_reported_after_s"]
    reported_median = f"{reported['median']:.2f} s" if reported else "n/a"
    return [
        f"{every}: kill -> first new step {total['median']:.2f} s median [{total['min']:.2f}-"
        f"{total['max']:.2f}] over {summary['kills']} kills",
        f"{every}: phases, median s: {said} (largest: "
        f"{summary['dominant_phase'].replace('_', ' ')})",
        f"{every}: work lost {lost['median']:.0f} steps median [{lost['min']:.0f}-"
        f"{lost['max']:.0f}] = {lost_s['median']:.2f} s at {summary['step_s'] * 1e3:.0f} ms "
        f"a step; back where it was after {back['median']:.2f} s median",
        f"{every}: saves reported written {reported_median} after their step (median)",
        f"{every}: saves begun before the kill and lost with a first rank that ended without "
        f"its record's end line: {summary['saves_in_flight_lost']} of {summary['kills']} "
        f"kills; ranks agree on the first new step: {summary['ranks_agree_on_first_step']}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_CONFIGURATIONS} (checkpoint_every, monitor interval), "
                             f"{QUICK_KILLS} kills each")
    args = parser.parse_args()
    configurations, kills = ((QUICK_CONFIGURATIONS, QUICK_KILLS) if args.quick
                             else (CONFIGURATIONS, KILLS))
    rng = random.Random(SEED)
    began = time.monotonic()
    summaries = []
    with (tempfile.TemporaryDirectory(prefix="ipycloud-elastic-restart-") as base,
          subreaper()):
        for every, monitor_s in configurations:
            raw = run_configuration(every, monitor_s, kills, rng,
                                    Path(base) / f"every-{every}-monitor-{monitor_s:g}")
            split_kills = [split(kill, raw["marks"], raw["records"], every)
                           for kill in raw["kills"]]
            summaries.append(summarise(every, monitor_s, split_kills,
                                       _reported_after(raw["marks"], raw["records"])))
            print("\n".join(lines(summaries[-1])), flush=True)
        _kill_descendants()
    results = {
        "machine": machine(),
        "settings": {"model": CASES[CASE].description, "world_size": NODES * PROCESSES_PER_NODE,
                     "nodes": NODES, "processes_per_node": PROCESSES_PER_NODE,
                     "backend": "gloo", "last_call_timeout_s": LAST_CALL_TIMEOUT_S,
                     "kills_per_configuration": kills, "seed": SEED, "quick": args.quick},
        "configurations": summaries,
        "seconds": round(time.monotonic() - began, 1),
    }
    write_results(RESULTS, results)
    print(f"{results['seconds']:.0f} s in all; written to {RESULTS}")


def _kill_descendants() -> None:
    """Kill whatever the agents' workers left behind (this process inherits orphans)."""
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


if __name__ == "__main__":
    main()
