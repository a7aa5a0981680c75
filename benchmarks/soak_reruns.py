"""Soak: a cell that saves a checkpoint in the background, rerun 50 times in a real kernel.

A real ipykernel (driven as ``tests/kernels.py`` does) makes a ~50 MB state once, then
runs RERUNS times the cell::

    manager = CheckpointManager(folder)
    manager.save(state, step=manager.next_step(), blocking=False)

Each rerun drops the previous manager without ``close()``, as rerunning a notebook cell
does. After each rerun, once its checkpoint is on disk, the kernel process is read
(``tests/soak_resources.py``) when its figures have settled: resident shared memory
(RssShmem in ``/proc/<pid>/status``), memory files (descriptors in ``/proc/<pid>/fd``,
regions and bytes mapped in ``/proc/<pid>/maps``), open descriptors, threads and child
processes. Each must stay flat: the largest and the last reading equal the first (one
live manager's region, writer thread and writer process). Figures: first, last and
largest of each.

Then a burst: BURST reruns back to back, each while the previous save is still written.
A dropped manager keeps its region and writer process until its write ends, so they pile
up for a while: the figures give the peak reading and how long the kernel took to come
back to the steady one.

Run: ``python benchmarks/soak_reruns.py [--reruns N]`` (about 2 minutes); results go to
``benchmarks/results/soak_reruns.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import astuple
from pathlib import Path
from typing import Any

from figures import write_results

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from kernels import kernel, run  # noqa: E402
from soak_resources import Held, held_by, settled, spread  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "soak_reruns.json"
RERUNS = 50
STATE_ELEMENTS = 12_500_000  # float32: 50 MB
SETUP = f"""
import torch
from ipycloud.runtime.checkpoint import CheckpointManager
state = {{"model": torch.randn({STATE_ELEMENTS})}}
"""
RERUN = """
manager = CheckpointManager({folder!r})
manager.save(state, step=manager.next_step(), blocking=False)
"""
SAVE_TIMEOUT_S = 120.0
BURST = 10


def run_burst(client: Any, pid: int, folder: Path, steady: Held) -> dict[str, Any]:
    """BURST reruns back to back; the peak reading, and the seconds until the steady one."""
    peak: Held | None = None
    for _ in range(BURST):
        run(client, RERUN.format(folder=str(folder)))
        reading = held_by(pid)
        peak = reading if peak is None else Held(*map(max, zip(
            astuple(peak), astuple(reading), strict=True)))
    started = time.monotonic()
    while (reading := held_by(pid)) != steady:
        if time.monotonic() - started > SAVE_TIMEOUT_S:
            break
        time.sleep(0.2)
    assert peak is not None
    return {"reruns": BURST, "peak": peak.as_dict(), "back_to_steady": reading == steady,
            "seconds_to_steady": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reruns", type=int, default=RERUNS)
    args = parser.parse_args()
    started, load_before = time.monotonic(), os.getloadavg()
    readings: list[Held] = []
    with tempfile.TemporaryDirectory(prefix="ipycloud-soak-reruns-", dir="/var/tmp") as base:
        folder = Path(base) / "checkpoints"
        with kernel(Path(base)) as (manager, client):
            pid = manager.provisioner.process.pid
            run(client, SETUP)
            before = settled(pid)
            for step in range(args.reruns):
                run(client, RERUN.format(folder=str(folder)))
                manifest = folder / f"step-{step:09d}.json"
                deadline = time.monotonic() + SAVE_TIMEOUT_S
                while not manifest.exists():
                    if time.monotonic() > deadline:
                        sys.exit(f"soak_reruns: step {step} was not saved in "
                                 f"{SAVE_TIMEOUT_S:.0f} s")
                    time.sleep(0.05)
                readings.append(settled(pid))
                print(f"rerun {step + 1}: {readings[-1]}", flush=True)
            burst = run_burst(client, pid, folder, readings[-1])
    figures = spread(readings)
    flat = {name: figure["max"] == figure["first"] == figure["last"]
            for name, figure in figures.items()}
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "reruns": args.reruns, "state_bytes": STATE_ELEMENTS * 4,
        "seconds": round(time.monotonic() - started, 1),
        "before_the_first_rerun": before.as_dict(),
        "figures": figures, "flat": flat, "all_flat": all(flat.values()),
        "readings": [reading.as_dict() for reading in readings],
        "burst": burst,
    }
    write_results(RESULTS, results)
    print(f"{'figure':<20}{'before':>10}{'first':>10}{'last':>10}{'max':>10}  flat")
    for name, figure in figures.items():
        print(f"{name:<20}{before.as_dict()[name]:>10}{figure['first']:>10}"
              f"{figure['last']:>10}{figure['max']:>10}  {'yes' if flat[name] else 'NO'}")
    print(f"burst of {BURST} reruns back to back: peak {burst['peak']}; back to the steady "
          f"reading: {burst['back_to_steady']}, after {burst['seconds_to_steady']} s")
    print(f"{args.reruns} reruns in {results['seconds']:.0f} s; written to {RESULTS}")


if __name__ == "__main__":
    main()
