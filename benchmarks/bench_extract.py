"""Benchmark: ``ipycloud.runtime.storage.extract`` against GNU ``tar -xf`` on many small files.

Goal: extracting an archive of 100,000 small files (1 to 512 random bytes each, from a fixed
seed, in 1,000 folders) takes at most 1.5x the time ``tar -xf`` takes on the same archive,
as a plain .tar and as a .tar.gz, with every check of ``extract`` on and its default
progress bar (sent to /dev/null).

The archives are built here with tarfile. Each tool first extracts each archive once,
untimed (the archive is then in the page cache for both, and this process has imported
what ``extract`` imports on first use, as a notebook that ran it before has). Each round
then extracts each archive once with each tool into a fresh folder under the scratch
folder (``/var/tmp``, a real disk, or the one given as the first argument), alternating
which tool goes first; every extraction starts after ``os.sync()``, so none pays for the
writeback of another. The ratio reported is the median of the rounds' ratios. Wall time
is the goal; CPU time (user + system, of this process for ``extract`` and of the child for
``tar``) is reported beside it, being less sensitive to other load on the machine, and so
is the load average before and after.
Extracted trees are deleted only at the end (deletions on a disk mounted with ``discard``
slow what follows). GNU tar must be installed: the benchmark exits non-zero without it.
Run: ``python benchmarks/bench_extract.py [SCRATCH_FOLDER]``; results go to
``benchmarks/results/extract.json``.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from figures import write_results

from ipycloud.runtime.storage.extract import ExtractReport, extract

RESULTS = Path(__file__).parent / "results" / "extract.json"
SEED = 20240611
TOP_DIRS, SUB_DIRS, FILES_PER_DIR = 100, 10, 100  # 100,000 files in 1,000 folders
MAX_FILE_BYTES = 512
ROUNDS = 7
GOAL = 1.5
KINDS: dict[str, Literal["w", "w:gz"]] = {"tar": "w", "tar.gz": "w:gz"}


def build(path: Path, mode: Literal["w", "w:gz"]) -> tuple[int, int]:
    """Write the archive; its file count and total file bytes."""
    rng = random.Random(SEED)
    files = total = 0
    with tarfile.open(path, mode) as archive:
        for top in range(TOP_DIRS):
            for sub in range(SUB_DIRS):
                folder = f"d{top:03d}/s{sub}"
                for index in range(FILES_PER_DIR):
                    data = rng.randbytes(rng.randint(1, MAX_FILE_BYTES))
                    info = tarfile.TarInfo(f"{folder}/f{index:03d}.bin")
                    info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
                    archive.addfile(info, io.BytesIO(data))
                    files += 1
                    total += len(data)
    return files, total


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def timed(action: Callable[[], object], who: int) -> tuple[float, float, object]:
    """Wall and CPU seconds ``action`` takes after flushing earlier writes; its result."""
    os.sync()
    cpu, started = cpu_seconds(who), time.perf_counter()
    outcome = action()
    return time.perf_counter() - started, cpu_seconds(who) - cpu, outcome


def with_tar(archive: Path, out: Path) -> Callable[[], object]:
    def run() -> object:
        out.mkdir()
        return subprocess.run(["tar", "-xf", str(archive), "-C", str(out)], check=True)
    return run


def with_ipycloud(archive: Path, out: Path) -> Callable[[], ExtractReport]:
    def run() -> ExtractReport:
        with open(os.devnull, "w") as nowhere, contextlib.redirect_stderr(nowhere):
            return extract(archive, out)  # the default progress bar, drawn to /dev/null
    return run


def measure(base: Path, archive: Path, files: int) -> dict[str, object]:
    with_tar(archive, base / f"{archive.name}-tar-warm-up")()
    with_ipycloud(archive, base / f"{archive.name}-ipycloud-warm-up")()
    walls: dict[str, list[float]] = {"ipycloud": [], "tar": []}
    cpus: dict[str, list[float]] = {"ipycloud": [], "tar": []}
    for round_no in range(ROUNDS):
        order = ["ipycloud", "tar"] if round_no % 2 == 0 else ["tar", "ipycloud"]
        for tool in order:
            out = base / f"{archive.name}-{tool}-{round_no}"
            if tool == "tar":
                wall, cpu, _ = timed(with_tar(archive, out), resource.RUSAGE_CHILDREN)
            else:
                wall, cpu, report = timed(with_ipycloud(archive, out), resource.RUSAGE_SELF)
                assert isinstance(report, ExtractReport), report
                assert report.extracted == files and not report.refused, report
            walls[tool].append(wall)
            cpus[tool].append(cpu)
    wall_ratios = [a / b for a, b in zip(walls["ipycloud"], walls["tar"], strict=True)]
    cpu_ratios = [a / b for a, b in zip(cpus["ipycloud"], cpus["tar"], strict=True)]
    ratio = statistics.median(wall_ratios)
    return {
        "ipycloud_s": statistics.median(walls["ipycloud"]),
        "tar_s": statistics.median(walls["tar"]),
        "ratio": ratio, "goal_ratio": GOAL, "goal_met": ratio <= GOAL,
        "cpu_ratio": statistics.median(cpu_ratios),
        "ipycloud_cpu_s": statistics.median(cpus["ipycloud"]),
        "tar_cpu_s": statistics.median(cpus["tar"]),
        "round_ratios": wall_ratios,
        "ipycloud_rounds_s": walls["ipycloud"], "tar_rounds_s": walls["tar"],
    }


def tool_version(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.split("\n")[0]


def main() -> None:
    if shutil.which("tar") is None or "GNU" not in tool_version("tar", "--version"):
        sys.exit("bench_extract: GNU tar is not installed; it is the reference this "
                 "benchmark measures against (install it, e.g. `apt-get install -y tar`)")
    scratch = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/var/tmp")
    base = Path(tempfile.mkdtemp(prefix="ipycloud-bench-extract-", dir=scratch))
    results: dict[str, object] = {}
    try:
        load_before = os.getloadavg()
        for kind, mode in KINDS.items():
            archive = base / f"small-files.{kind}"
            files, total = build(archive, mode)
            results[kind] = {"archive_bytes": archive.stat().st_size,
                             **measure(base, archive, files)}
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = {
        "machine": {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "folder": str(scratch), "tar": tool_version("tar", "--version"),
                    "load_average_1_5_15_min_before": load_before,
                    "load_average_1_5_15_min_after": load_after},
        "archive": {"files": files, "folders": TOP_DIRS * (SUB_DIRS + 1),
                    "file_bytes": total, "max_file_bytes": MAX_FILE_BYTES,
                    "rounds": ROUNDS, "seed": SEED},
        **results,
    }
    write_results(RESULTS, summary)
    print("\n".join(verdicts(summary, results)))


def verdicts(summary: dict[str, object], results: dict[str, object]) -> list[str]:
    """The figures in words: the archive and the load, then one line an archive kind."""
    archive, machine = summary["archive"], summary["machine"]
    assert isinstance(archive, dict) and isinstance(machine, dict)
    before, after = (machine[f"load_average_1_5_15_min_{when}"] for when in ("before", "after"))
    lines = [f"archive: {archive['files']} files in {archive['folders']} folders, "
             f"{archive['file_bytes'] / 1e6:.1f} MB; {archive['rounds']} rounds under "
             f"{machine['folder']}; load average {before[0]:.2f} before, {after[0]:.2f} after"]
    for kind, row in results.items():
        assert isinstance(row, dict)
        verdict = "met" if row["goal_met"] else "MISSED"
        lines.append(f"{kind:7s} extract {row['ipycloud_s']:.2f} s, tar -xf {row['tar_s']:.2f} s:"
                     f" x{row['ratio']:.2f} (goal <= {GOAL}: {verdict}); "
                     f"CPU x{row['cpu_ratio']:.2f}")
    return [*lines, f"written to {RESULTS}"]

if __name__ == "__main__":
    main()
