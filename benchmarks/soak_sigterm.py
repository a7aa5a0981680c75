"""Soak: SIGTERM (the machine going away) at random moments of ``fit``, over a hundred times.

Each run is a fresh interpreter running tests/preempted_training.py: a seeded ``fit`` of 3
epochs of 12 steps (batches of 8) with validation after each, a checkpoint every 5 steps,
each item taking ITEM_DELAY_S (3 ms) to load, so that ``fit`` lasts some 2 s, about half
of it validating; it notes in a timeline file when it calls ``fit`` and when it finishes
each step and epoch. A chain is a run from scratch, then reruns on the same folder, each
but the last preempted again (1 to MAX_SIGTERMS_PER_CHAIN signals, drawn, fewer where the
run is complete sooner); the last is left to finish. This benchmark sends each SIGTERM
from outside at a moment drawn uniformly over what is left of the run, counted from the
call of ``fit``: the median duration of ``fit`` in UNINTERRUPTED_RUNS uninterrupted runs
of the configuration, times the share of its steps not yet saved. Every draw comes from
SEED.

Goals:

1. The last finished step is saved: a run the signal reaches inside ``fit`` prints "saved
   step N", the newest checkpoint in the folder is step N, and N is the last step the run
   had finished when the signal came (from its timeline; the step it resumed from if none)
   or the one then in progress, which it finishes first: N - finished is 0 or 1.
2. Within the grace period: the checkpoint is committed, and the process has ended (by
   the signal: exit status -15), within GRACE_S (30 s) of the signal. The commit is timed
   by the mtime of the checkpoint's manifest, written last and atomically (the time of its
   temporary file's last write, before its fsync and rename); a checkpoint already
   committed before the signal counts 0 (its negative time is kept in the records). The end
   is when the benchmark's wait for the process returns. A process alive GRACE_S after the
   signal is killed (SIGKILL, as the platform would) and counted late.
3. Every chain ends in the uninterrupted run's final state (model and optimizer), bit for
   bit, and its last run exits 0.
4. Nothing outlives a run: each runs in a session of its own, and GRACE_S after its
   process ended no process of that session may be left (DataLoader workers, writer
   processes, ranks).

Configurations (each with validation after every epoch):

- "one": one process; the signal goes to that process.
- "workers": a DataLoader with 2 worker processes; the signal goes to every process of the
  session (as when a machine goes away: the workers ignore it, the loop saves).
- "launch": ``ipycloud.launch`` with 2 processes (gloo); the signal goes to the launching
  process only, which passes it on to every rank (6 steps an epoch on each).

Where each signal landed is told from the timeline: "setup" (fit called, no step taken
yet: resuming, starting workers, the first batch), "mid-epoch" (after a step that does not
end its epoch), "validation" (after an epoch's last step, before the epoch is noted),
"epoch start" (after that, before the next step: the epoch's checkpoint, the workers
starting again), "end" (after the last epoch: the final save, writing OUT). A signal that
comes before ``fit`` has installed its handler, or after it returned, ends the process with
nothing to save: such runs count apart ("outside fit") and their chains must still end
exactly.

Run: ``python benchmarks/soak_sigterm.py [--sigterms N] [--seed S]``; results go to
``benchmarks/results/soak_sigterm.json``: the figures, every run, and the settings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import torch  # noqa: E402
from checkpoint_helpers import differences  # noqa: E402
from figures import distribution, write_soak  # noqa: E402

SCRIPT = TESTS / "preempted_training.py"
RESULTS = Path(__file__).parent / "results" / "soak_sigterm.json"
SIGTERMS = 102  # at least, in all; split among the configurations by SHARES
SHARES = {"one": 0.4, "workers": 0.35, "launch": 0.25}
OPTIONS = {"one": [], "workers": ["--workers", "2"], "launch": ["--launch"]}
STEPS_PER_EPOCH = {"one": 12, "workers": 12, "launch": 6}
EPOCHS = 3
ITEM_DELAY_S = 0.003  # each item takes this long to load: a run of some 2 s
UNINTERRUPTED_RUNS = 3  # of each configuration: the state to reach, and the duration
MAX_SIGTERMS_PER_CHAIN = 3
GRACE_S = 30.0
START_LIMIT_S = 120.0  # for a run to call fit
SEED = 20261126
SAVED = re.compile(r"ipycloud\.fit: saved step (\d+); rerun this cell to continue")


class Run:
    """One process of tests/preempted_training.py in a session of its own, its timeline
    and what it printed."""

    def __init__(self, config: str, folder: Path, out: Path, timeline: Path) -> None:
        timeline.unlink(missing_ok=True)
        self.timeline_file = timeline
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (read after the run)
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(folder), str(out), "--timeline", str(timeline),
             "--item-delay", str(ITEM_DELAY_S), *OPTIONS[config]], stdout=self.log,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.ended_at: float | None = None

    def timeline(self) -> list[tuple[str, float]]:
        """(what, time) of each point reached, in order."""
        if not self.timeline_file.exists():
            return []
        points = []
        for line in self.timeline_file.read_text().splitlines():
            what, _, moment = line.rpartition(" ")
            points.append((what, float(moment)))
        return points

    def called_fit(self) -> float | None:
        """When it called fit: waits for that (None if it ended first)."""
        deadline = time.monotonic() + START_LIMIT_S
        while time.monotonic() < deadline:
            points = dict(self.timeline())
            if "fit" in points:
                return points["fit"]
            if self.process.poll() is not None:
                return None
            time.sleep(0.002)
        raise TimeoutError(f"the run did not call fit in {START_LIMIT_S} s: {self.output()}")

    def end(self, limit_s: float) -> bool:
        """Wait up to ``limit_s`` for the process to end; False when it had to be killed."""
        try:
            self.process.wait(limit_s)
            ended = True
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            ended = False
        self.ended_at = time.time()
        return ended

    def leftovers(self) -> int:
        """How many processes of its session are left GRACE_S after it ended (then killed)."""
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            if not session_members(self.process.pid):
                return 0
            time.sleep(0.05)
        left = session_members(self.process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        return len(left)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()


def session_members(session: int) -> list[int]:
    """The live processes of a session (zombies left out)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":  # state, ..., session
                members.append(int(entry.name))
    return members


def manifests(folder: Path) -> list[tuple[dict[str, Any], int]]:
    """The folder's checkpoint manifests with their mtimes (ns), oldest first."""
    found = []
    for path in folder.glob("step-*.json") if folder.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            found.append((json.loads(path.read_text()), path.stat().st_mtime_ns))
    return sorted(found, key=lambda item: item[0]["sequence"])


def phase(points: list[tuple[str, float]], moment: float, config: str) -> tuple[str, int | None]:
    """Where the run stood at ``moment``, and the last step it had finished (None: no step
    in this run yet)."""
    before = [what for what, when in points if when <= moment]
    steps = [int(what.split()[1]) for what in before if what.startswith("step ")]
    epochs = [what for what in before if what.startswith("epoch ")]
    last = before[-1] if before else "fit"
    if last in ("trained", "written") or len(epochs) == EPOCHS:
        return "end", steps[-1] if steps else None
    if last == "fit":
        return "setup", None
    if last.startswith("epoch "):
        return "epoch start", steps[-1] if steps else None
    if steps[-1] % STEPS_PER_EPOCH[config] == 0:
        return "validation", steps[-1]
    return "mid-epoch", steps[-1]


def preempt(config: str, folder: Path, out: Path, timeline: Path, delay_s: float
            ) -> dict[str, Any]:
    """A run sent SIGTERM ``delay_s`` after it calls fit; what happened."""
    resumed_from = max((manifest["step"] for manifest, _ in manifests(folder)), default=0)
    run = Run(config, folder, out, timeline)
    record: dict[str, Any] = {"config": config, "delay_s": round(delay_s, 4),
                              "resumed_from": resumed_from}
    called = run.called_fit()
    if called is not None:
        time.sleep(max(0.0, called + delay_s - time.time()))
    signalled = time.time()
    try:
        if config == "workers":
            os.killpg(run.process.pid, signal.SIGTERM)
        else:
            run.process.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    ended = run.end(GRACE_S)
    record.update(exit_code=run.process.returncode, late=not ended,
                  exit_s=round(run.ended_at - signalled, 4) if run.ended_at else None,
                  leftovers=run.leftovers())
    text = run.output()
    points = run.timeline()
    where, finished = phase(points, signalled, config)
    saved = SAVED.search(text)
    record.update(phase=where, finished=finished if finished is not None else resumed_from)
    if "written" in dict(points) and dict(points)["written"] <= signalled:
        record["outcome"] = "finished first"
    elif saved:
        record["outcome"] = "saved"
        record.update(saved_step=int(saved[1]),
                      saved_minus_finished=int(saved[1]) - record["finished"])
        newest, mtime_ns = manifests(folder)[-1]
        record.update(newest_step=newest["step"],
                      commit_s=round(mtime_ns / 1e9 - signalled, 4))
    elif run.process.returncode == -signal.SIGTERM:
        record["outcome"] = "outside fit"
    else:
        record["outcome"] = "unexpected"
    if record["outcome"] == "unexpected" or (saved and not ended):
        record["output_tail"] = text[-4000:]
    return record


def chain(config: str, sigterms: int, duration_s: float, draw: random.Random, base: Path,
          index: int, reference: dict[str, Any]) -> dict[str, Any]:
    """A run from scratch and its reruns, up to ``sigterms`` of them preempted (fewer where
    the run is complete sooner), each at a moment drawn over what is left of the run; the
    last is left to finish."""
    folder, out, timeline = (base / f"{config} {index}", base / f"{config} {index}.pt",
                             base / f"{config} {index}.timeline")
    total = EPOCHS * STEPS_PER_EPOCH[config]
    runs: list[dict[str, Any]] = []
    while len(runs) < sigterms:
        done = max((manifest["step"] for manifest, _ in manifests(folder)), default=0)
        if done == total:
            break
        left_s = duration_s * (total - done) / total
        runs.append(preempt(config, folder, out, timeline, draw.uniform(0.0, left_s)))
    last = Run(config, folder, out, timeline)
    finished = last.end(START_LIMIT_S + GRACE_S)
    record: dict[str, Any] = {"config": config, "index": index, "runs": runs,
                              "last_exit_code": last.process.returncode if finished else None,
                              "last_leftovers": last.leftovers()}
    wrong = differences(torch.load(out), reference) if out.exists() else ["no final state"]
    record["bit_exact"] = not wrong and record["last_exit_code"] == 0
    if not record["bit_exact"]:
        record["differences"] = wrong[:5]
        record["last_output_tail"] = last.output()[-4000:]
    return record


def uninterrupted(config: str, base: Path) -> tuple[dict[str, Any], list[float]]:
    """The final state of the run never interrupted (the same in each of its runs), and how
    long its fit took in each."""
    states, seconds = [], []
    for number in range(UNINTERRUPTED_RUNS):
        folder, out, timeline = (base / f"{config} whole {number}",
                                 base / f"{config} whole {number}.pt",
                                 base / f"{config} whole {number}.timeline")
        run = Run(config, folder, out, timeline)
        if not run.end(START_LIMIT_S + GRACE_S) or run.process.returncode != 0:
            raise RuntimeError(f"the uninterrupted {config} run failed: {run.output()[-3000:]}")
        points = dict(run.timeline())
        states.append(torch.load(out))
        seconds.append(round(points["trained"] - points["fit"], 4))
    if any(differences(state, states[0]) for state in states[1:]):
        raise RuntimeError(f"the uninterrupted {config} runs ended in different states")
    return states[0], seconds


def summary(chains: list[dict[str, Any]]) -> dict[str, Any]:
    runs = [run for record in chains for run in record["runs"]]
    saved = [run for run in runs if run["outcome"] == "saved"]
    delivered = [run for run in runs if run["outcome"] != "finished first"]
    return {
        "sigterms_delivered": len(delivered),
        "outcomes": dict(Counter(run["outcome"] for run in runs)),
        "phases": dict(Counter(run["phase"] for run in delivered)),
        "saved_minus_finished_by_phase": {
            name: dict(Counter(run["saved_minus_finished"] for run in saved
                               if run["phase"] == name))
            for name in sorted({run["phase"] for run in saved})},
        "not_the_last_finished_step": [run for run in saved
                                       if run["saved_minus_finished"] not in (0, 1)
                                       or run["newest_step"] != run["saved_step"]],
        "commit_s": distribution([max(0.0, run["commit_s"]) for run in saved]),
        "committed_before_the_signal": sum(run["commit_s"] < 0 for run in saved),
        "exit_s": distribution([run["exit_s"] for run in delivered if not run["late"]]),
        "late": [run for run in delivered if run["late"] or run.get("commit_s", 0) > GRACE_S],
        "unexpected": [run for run in runs if run["outcome"] == "unexpected"],
        "not_ended_by_the_signal": [run for run in delivered
                                    if run["exit_code"] != -signal.SIGTERM],
        "leftover_processes": sum(run["leftovers"] for run in runs)
        + sum(record["last_leftovers"] for record in chains),
        "chains": len(chains),
        "chains_bit_exact": sum(record["bit_exact"] for record in chains),
    }


def print_summary(name: str, figures: dict[str, Any]) -> None:
    commit, ended = figures["commit_s"], figures["exit_s"]
    print(f"{name:8s} {figures['sigterms_delivered']} SIGTERMs {figures['outcomes']}, "
          f"where: {figures['phases']}")
    print(f"         saved step - finished step: {figures['saved_minus_finished_by_phase']}; "
          f"not the last finished step {len(figures['not_the_last_finished_step'])}")
    print(f"         signal to commit: median {commit.get('median')} s, p99 "
          f"{commit.get('p99')} s, max {commit.get('max')} s; to the end: median "
          f"{ended.get('median')} s, max {ended.get('max')} s; late {len(figures['late'])}"
          f"; unexpected {len(figures['unexpected'])}; not ended by the signal "
          f"{len(figures['not_ended_by_the_signal'])}; leftover processes "
          f"{figures['leftover_processes']}")
    print(f"         chains bit for bit: {figures['chains_bit_exact']} of {figures['chains']}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sigterms", type=int, default=SIGTERMS, help="at least, in all")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON to write")
    args = parser.parse_args()
    began, load_before = time.monotonic(), os.getloadavg()[0]
    draw = random.Random(args.seed)
    results: dict[str, Any] = {"settings": {
        "sigterms": args.sigterms, "seed": args.seed, "shares": SHARES, "grace_s": GRACE_S,
        "epochs": EPOCHS, "steps_per_epoch": STEPS_PER_EPOCH, "item_delay_s": ITEM_DELAY_S,
        "max_sigterms_per_chain": MAX_SIGTERMS_PER_CHAIN}, "configs": {}}
    every: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ipycloud-soak-sigterm-", dir="/var/tmp") as name:
        base = Path(name)
        os.environ.update(TMPDIR=str(base), XDG_STATE_HOME=str(base / "state"))
        for config, share in SHARES.items():
            reference, seconds = uninterrupted(config, base)
            duration_s = statistics.median(seconds)
            chains: list[dict[str, Any]] = []
            wanted = round(args.sigterms * share + 0.5)
            while sum(run["outcome"] != "finished first"
                      for record in chains for run in record["runs"]) < wanted:
                sigterms = draw.randint(1, MAX_SIGTERMS_PER_CHAIN)
                chains.append(chain(config, sigterms, duration_s, draw, base, len(chains),
                                    reference))
            figures = summary(chains)
            print_summary(config, figures)
            results["configs"][config] = {"fit_s_uninterrupted": seconds,
                                          "figures": figures, "chains": chains}
            every += chains
    results["all"] = summary(every)
    print_summary("all", results["all"])
    write_soak(results, args.out, began, load_before, "/var/tmp")


if __name__ == "__main__":
    main()
