"""Benchmark: what the fault-injecting test file system (tests/faultfs.py) costs the tests
that write checkpoints and sync folders through it.

Measured on one disk (``/var/tmp``), each as the same work done directly in the backing
folder and through the mount (no fault set):

* a model-sized file: LARGE_BYTES (50 MB and 400 MB) written, flushed, fsynced and
  closed, then read back (cold when this process may drop the page cache, else warm);
* many small files: SMALL_FILES files of SMALL_BYTES created, written and closed, then
  listed and stat'ed;
* a mount's start (until the kernel talks to it) and its end (daemon stopped, unmounted),
  which every test using the ``faulty_mount`` fixture pays.

Every timed operation starts after ``os.sync()``. Each figure is the median of ROUNDS
rounds, direct and through the mount back to back in an order that alternates from round
to round; the ratio is the median of the rounds' ratios. Run:
``python benchmarks/bench_faultfs.py``; results go to ``benchmarks/results/faultfs.json``.
MB are 10^6 bytes.
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from figures import write_results

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from faultfs import fuse_missing, mounted  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "faultfs.json"
LARGE_BYTES = (50_000_000, 400_000_000)
SMALL_FILES = 1000
SMALL_BYTES = 4096
ROUNDS = 5


def timed(action: Callable[..., object], *args: object) -> float:
    """Seconds ``action(*args)`` takes after flushing earlier writes."""
    os.sync()
    started = time.perf_counter()
    action(*args)
    return time.perf_counter() - started


def drop_page_cache() -> bool:
    """Drop the clean page cache, where this process may (root); whether it did."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("1\n")
    except OSError:
        return False
    return True


def write_large(folder: Path, round_no: int, data: bytes) -> None:
    with open(folder / f"large-{round_no}.bin", "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def read_large(folder: Path, round_no: int) -> None:
    with open(folder / f"large-{round_no}.bin", "rb") as file:
        while file.read(1 << 20):
            pass


def before_reading(folder: Path, round_no: int) -> None:
    """A cold read where the page cache can be dropped, else a warm one."""
    if not drop_page_cache():
        read_large(folder, round_no)


def write_small(folder: Path, round_no: int, data: bytes) -> None:
    folder = folder / f"small-{round_no}"
    folder.mkdir()
    for index in range(SMALL_FILES):
        with open(folder / f"f{index:04d}", "wb") as file:
            file.write(data)


def list_small(folder: Path, round_no: int) -> None:
    folder = folder / f"small-{round_no}"
    for name in os.listdir(folder):
        os.stat(folder / name)


def compare(name: str, folders: dict[str, Path], work: Callable[[Path, int], object],
            before: Callable[[Path, int], object] = lambda folder, round_no: None,
            ) -> dict[str, object]:
    """``work(folder, round_no)`` in the direct folder and in the one through the mount,
    ROUNDS times, alternating which goes first, each after ``before``: medians, ratio."""
    samples: dict[str, list[float]] = {side: [] for side in folders}
    for round_no in range(ROUNDS):
        for side in folders if round_no % 2 == 0 else reversed(folders):
            before(folders[side], round_no)
            samples[side].append(timed(work, folders[side], round_no))
    direct, through = samples["direct"], samples["faultfs"]
    row = {"direct_s": statistics.median(direct), "faultfs_s": statistics.median(through),
           "ratio": statistics.median([b / a for a, b in zip(direct, through, strict=True)]),
           "direct_rounds_s": direct, "faultfs_rounds_s": through}
    print(f"{name:30s} direct {row['direct_s']:.3f} s, faultfs {row['faultfs_s']:.3f} s: "
          f"x{row['ratio']:.2f}")
    return row


def mount_start_and_end(base: Path) -> dict[str, object]:
    """What a test pays to mount and to unmount."""
    starts, ends = [], []
    for round_no in range(ROUNDS):
        started = time.perf_counter()
        with mounted(base / "backing", base / f"mount {round_no}"):
            starts.append(time.perf_counter() - started)
            started = time.perf_counter()
        ends.append(time.perf_counter() - started)
    print(f"mount start {statistics.median(starts) * 1000:.0f} ms, "
          f"end {statistics.median(ends) * 1000:.0f} ms")
    return {"start_s": statistics.median(starts), "end_s": statistics.median(ends),
            "start_rounds_s": starts, "end_rounds_s": ends}


def measure(base: Path) -> dict[str, object]:
    cold = drop_page_cache()
    results: dict[str, object] = {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "folder": str(base.parent),
                    "page_cache_dropped_before_reads": cold, "rounds": ROUNDS}}
    with mounted(base / "backing", base / "mount") as mount:
        folders = {"direct": base / "backing" / "direct", "faultfs": mount.path / "faultfs"}
        for folder in folders.values():
            folder.mkdir()
        for size in LARGE_BYTES:
            data, label = os.urandom(size), f"{size // 1_000_000} MB"
            results[f"write_fsync_{label}"] = compare(
                f"write+fsync {label}", folders, functools.partial(write_large, data=data))
            results[f"read_{label}"] = compare(f"read {label} ({'cold' if cold else 'warm'})",
                                               folders, read_large, before=before_reading)
            for folder in folders.values():
                for path in folder.glob("large-*.bin"):
                    path.unlink()
        results["small_files_write"] = compare(
            f"{SMALL_FILES} x {SMALL_BYTES} B written", folders,
            functools.partial(write_small, data=os.urandom(SMALL_BYTES)))
        results["small_files_list_stat"] = compare(f"{SMALL_FILES} files listed, stat'ed",
                                                   folders, list_small)
    results["mount"] = mount_start_and_end(base)
    return results


def main() -> None:
    if reason := fuse_missing():
        sys.exit(f"bench_faultfs: {reason}")
    with tempfile.TemporaryDirectory(prefix="ipycloud-bench-faultfs-", dir="/var/tmp") as base:
        results = measure(Path(base))
    write_results(RESULTS, results)
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
