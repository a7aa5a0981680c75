"""Soak: checkpoints under SIGKILL at random moments, at scale.

Kills (``tests/soak_kills.py`` says how each is made and checked), by default
KILLS per kind, 520 in all: a process saving with ``blocking=True``; one whose
background saves the writer process writes; one whose background saves a thread writes
(no interpreter to start the writer process, and ``background="thread"``, in turn); the
writer process itself, during a write, its process living on; ``ipycloud.fit`` with two
DataLoader workers and periodic background checkpoints, killed at random steps, resumed,
and compared with an uninterrupted run. The moments follow from ``--seed``, so a run can be
repeated; what the machine does beside it still shifts where a kill lands.

After each kill: the newest acknowledged checkpoint must load and hold its state (lost),
no data file may fail its manifest's size or CRC-32, computed by the soak with zlib
(corrupt), no checkpoint may appear once its process is dead, and after the next save no
temporary or orphan data file and no process of the killed one may be left (left
behind; a writer process gets 5 s to end, DataLoader workers 10 s). The processes a kill
leaves are reaped late, as by an init that reaps late: the next save meets them as
zombies. A fit run resumed after its kills must end bitwise equal to the uninterrupted
run (resumed equal), and each checkpoint loaded must hold the weights that run had at its
step.

Run: ``python benchmarks/soak_kill.py [--seed N] [--scale F] [--kind K --kills N]
[--out FILE]`` (about 15 minutes on 2 cores; ``--scale 0.1`` for a short run; ``--kind``:
that kind alone, N kills); results go to ``benchmarks/results/soak_kill.json`` (or FILE),
every kill in it.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import write_results

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import torch  # noqa: E402
from soak_kills import KINDS, Soak, as_records, summary  # noqa: E402
from soak_processes import subreaper  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "soak_kill.json"
KILLS = {"blocking": 110, "writer process": 110, "thread": 100, "writer killed": 100,
         "fit": 100}
COLUMNS = ("kills", "lost", "corrupt", "committed_after_kill", "left_behind")
PLURALS = {"writer process": "writer processes", "worker": "other children (DataLoader workers)",
           "rank": "launch ranks"}


def table(kinds: dict[str, Any]) -> list[str]:
    lines = [f"{'kind':<16}" + "".join(f"{column.replace('_', ' '):>22}"
                                        for column in COLUMNS) + f"{'resumed equal':>16}"]
    for kind, row in kinds.items():
        resumed = (f"{row['resumed_equal']}/{row['resumed_compared']}"
                   if row["resumed_compared"] else "-")
        lines.append(f"{kind:<16}" + "".join(f"{row[column]:>22}" for column in COLUMNS)
                     + f"{resumed:>16}")
    lines.append("")
    for kind, row in kinds.items():
        lines.append(f"{kind}: where the kills landed")
        for where, count in sorted(row["landed"].items(), key=lambda item: -item[1]):
            lines.append(f"  {count:>5}  {where}")
        for role, seconds in row["exit_s"].items():
            lines.append(f"  {PLURALS.get(role, role)} it had started: {seconds['count']}, ended "
                         f"{seconds['median']:.2f} s after the kill (median), "
                         f"{seconds['max']:.2f} s at most")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every kind's number of kills (0.1: a short run)")
    parser.add_argument("--kind", choices=KINDS, help="this kind of kill alone")
    parser.add_argument("--kills", type=int, default=1, help="with --kind: how many")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON to write")
    args = parser.parse_args()
    counts = ({args.kind: args.kills} if args.kind else
              {kind: max(1, round(KILLS[kind] * args.scale)) for kind in KINDS})
    torch.set_num_threads(1)
    started = time.monotonic()
    load_before = os.getloadavg()
    with (tempfile.TemporaryDirectory(prefix="ipycloud-soak-kill-", dir="/var/tmp") as base,
          subreaper()):
        kills = Soak(Path(base), args.seed, progress=lambda line: print(line, flush=True)
                     ).run(counts)
    kinds = summary(kills)
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "load_average_before": load_before,
                    "load_average_after": os.getloadavg()},
        "seed": args.seed, "scale": args.scale, "kills_asked": counts,
        "seconds": round(time.monotonic() - started, 1),
        "kinds": kinds,
        "failures": [{"kind": kill.kind, "failures": kill.failures()} for kill in kills
                     if kill.failures()],
        "kills": as_records(kills),
    }
    write_results(args.out, results)
    print("\n".join(table(kinds)))
    for failure in results["failures"]:
        print(f"FAILED: {failure['kind']}: {'; '.join(failure['failures'])}")
    print(f"{len(kills)} kills in {results['seconds']:.0f} s; written to {args.out}")


if __name__ == "__main__":
    main()
