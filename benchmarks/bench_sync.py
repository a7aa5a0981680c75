"""Benchmark: ``ipycloud.runtime.storage.sync`` against ``cp -a`` and ``rsync -a`` on a real disk.

Goals, on a tree of 10,000 files totalling about 300 MB (many small files, some large ones,
about 100 nested folders, random bytes from a fixed seed) under ``/var/tmp``:

* a first full copy takes at most 1.2x ``cp -a``. Sync's copy is on disk when it returns;
  cp's is in the page cache, so ``cp -a`` followed by ``sync`` is reported beside it.
  The ratio is the median of the rounds' ratios (each round times both tools back to back);
* a no-change pass takes at most 1.0x ``rsync -a`` on an already synced destination;
* an incremental pass after 1% of the files (100) got new content and mtimes takes at most
  1.0x ``rsync -a`` doing the same.

Every timed operation starts after ``os.sync()``, so none pays another's writeback. Each
measurement runs ROUNDS times, alternating which tool goes first, and reports medians: on
a virtual disk the same copy can take 0.25 s or 1.1 s depending on the host's writeback
state. Nothing is deleted until the end (this disk is mounted with ``discard``, and
deletions slow what follows). The incremental rounds apply the same modification to the
source before each timed pair. rsync must be installed: the benchmark exits non-zero
without it. Run: ``python benchmarks/bench_sync.py``; results go to
``benchmarks/results/sync.json``.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from figures import write_results

from ipycloud.runtime.storage.sync import SyncReport, sync

RESULTS = Path(__file__).parent / "results" / "sync.json"
SEED = 20240607
FILES = 10_000
LARGE = 100
LARGE_BYTES = 2_200_000
SMALL_MAX = 16_384
TOP_DIRS, SUB_DIRS = 10, 9  # 10 top folders of 9 subfolders each: 100 folders in all
CHANGED = 100
ROUNDS = 5
GOALS = {"first_copy": 1.2, "no_change": 1.0, "incremental": 1.0}


def make_tree(root: Path, rng: random.Random) -> tuple[list[Path], int]:
    """Write the source tree; its files and total size."""
    folders = []
    for top in range(TOP_DIRS):
        folders.append(root / f"d{top:02d}")
        folders.extend(root / f"d{top:02d}" / f"s{sub}" for sub in range(SUB_DIRS))
    for folder in folders:
        folder.mkdir(parents=True)
    files, total = [], 0
    for index in range(FILES):
        size = LARGE_BYTES if index % (FILES // LARGE) == 0 else rng.randint(1, SMALL_MAX)
        path = rng.choice(folders) / f"f{index:05d}.bin"
        path.write_bytes(rng.randbytes(size))
        files.append(path)
        total += size
    return files, total


def modify(files: list[Path], rng: random.Random, round_no: int) -> None:
    """Rewrite CHANGED files with new content of the same size and a new mtime."""
    stamp = time.time_ns() + (round_no + 1) * 1_000_000_000
    for path in rng.sample(files, CHANGED):
        path.write_bytes(rng.randbytes(path.stat().st_size))
        os.utime(path, ns=(stamp, stamp))


def timed(action: Callable[[], object]) -> tuple[float, object]:
    """Seconds ``action`` takes after flushing earlier writes, and what it returned."""
    os.sync()
    started = time.perf_counter()
    outcome = action()
    return time.perf_counter() - started, outcome


def run(*command: str) -> Callable[[], object]:
    """An action running a command that must succeed."""
    return lambda: subprocess.run(command, check=True)


def sync_action(src: Path, dst: Path) -> Callable[[], SyncReport]:
    return lambda: sync(src, dst, progress=False)


def pair(name: str, sync_s: float, ref_name: str, ref_s: float) -> dict[str, object]:
    """Medians side by side and their ratio against the goal."""
    ratio = sync_s / ref_s
    return {"sync_s": sync_s, f"{ref_name}_s": ref_s, "ratio": ratio, "goal_ratio": GOALS[name],
            "goal_met": ratio <= GOALS[name]}


def measure(base: Path) -> dict[str, object]:
    rng = random.Random(SEED)
    src, dst_c = base / "src", base / "dst_c"
    src.mkdir()
    files, total = make_tree(src, rng)

    first_sync, first_cp, first_cp_durable = [], [], []
    for round_no in range(ROUNDS):
        order = ["sync", "cp"] if round_no % 2 == 0 else ["cp", "sync"]
        for tool in order:
            if tool == "sync":
                seconds, report = timed(sync_action(src, base / f"first_sync_{round_no}"))
                assert isinstance(report, SyncReport) and len(report.copied) == FILES, report
                first_sync.append(seconds)
            else:
                first_cp.append(timed(run("cp", "-a", str(src), str(base / f"cp_{round_no}")))[0])
                started = time.perf_counter()
                os.sync()  # what cp left unflushed: sync's copies are already on disk
                first_cp_durable.append(first_cp[-1] + time.perf_counter() - started)
    first = pair("first_copy", statistics.median(first_sync), "cp", statistics.median(first_cp))
    paired = [a / b for a, b in zip(first_sync, first_cp, strict=True)]
    first.update(ratio=statistics.median(paired),
                 goal_met=statistics.median(paired) <= GOALS["first_copy"],
                 round_ratios=paired, sync_rounds_s=first_sync, cp_rounds_s=first_cp,
                 cp_then_os_sync_s=statistics.median(first_cp_durable),
                 ratio_to_cp_then_os_sync=statistics.median(first_sync)
                 / statistics.median(first_cp_durable))
    dst_a = base / "first_sync_0"  # the later passes sync again into the first copy

    rsync = run("rsync", "-a", f"{src}/", f"{dst_c}/")
    rsync_initial, _ = timed(rsync)
    still_sync, still_rsync = [], []
    for _ in range(ROUNDS):
        seconds, report = timed(sync_action(src, dst_a))
        assert isinstance(report, SyncReport) and report.unchanged == FILES, report
        still_sync.append(seconds)
        still_rsync.append(timed(rsync)[0])
    no_change = pair("no_change", statistics.median(still_sync), "rsync",
                     statistics.median(still_rsync))

    inc_sync, inc_rsync = [], []
    for round_no in range(ROUNDS):
        modify(files, rng, round_no)
        order = ["sync", "rsync"] if round_no % 2 == 0 else ["rsync", "sync"]
        for tool in order:
            if tool == "sync":
                seconds, report = timed(sync_action(src, dst_a))
                assert isinstance(report, SyncReport) and len(report.updated) == CHANGED, report
                inc_sync.append(seconds)
            else:
                inc_rsync.append(timed(rsync)[0])
    incremental = pair("incremental", statistics.median(inc_sync), "rsync",
                       statistics.median(inc_rsync))
    incremental.update(sync_rounds_s=inc_sync, rsync_rounds_s=inc_rsync)
    no_change.update(sync_rounds_s=still_sync, rsync_rounds_s=still_rsync)

    return {
        "machine": {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "folder": str(base.parent),
                    "rsync": subprocess.run(["rsync", "--version"], capture_output=True,
                                            text=True, check=True).stdout.split("\n")[0]},
        "tree": {"files": FILES, "folders": TOP_DIRS * (SUB_DIRS + 1), "bytes": total,
                 "large_files": LARGE, "changed_files": CHANGED, "rounds": ROUNDS,
                 "seed": SEED},
        "first_copy": first,
        "rsync_initial_s": rsync_initial,
        "no_change": no_change,
        "incremental": incremental,
    }


def main() -> None:
    if shutil.which("rsync") is None:
        sys.exit("bench_sync: rsync is not installed; it is the reference this benchmark "
                 "measures against (install it, e.g. `apt-get install -y rsync`)")
    base = Path(tempfile.mkdtemp(prefix="ipycloud-bench-sync-", dir="/var/tmp"))
    try:
        results = measure(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    write_results(RESULTS, results)
    tree = results["tree"]
    assert isinstance(tree, dict)
    print(f"tree: {tree['files']} files, {tree['folders']} folders, "
          f"{tree['bytes'] / 1e6:.0f} MB")
    for name, ref in (("first_copy", "cp"), ("no_change", "rsync"), ("incremental", "rsync")):
        row = results[name]
        assert isinstance(row, dict)
        print(f"{name:12s} sync {row['sync_s']:.3f} s, {ref} {row[f'{ref}_s']:.3f} s: "
              f"x{row['ratio']:.2f} (goal <= {row['goal_ratio']}: "
              f"{'met' if row['goal_met'] else 'MISSED'})")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
