"""Benchmark: what ``%load_ext ipycloud`` adds to a shell start, and warm ``%gpuinfo`` latency.

Goals: loading the extension adds under 50 ms to a bare IPython shell start and imports no
torch; a warm ``%gpuinfo`` takes under 20 ms without a GPU (NVML queries, never a
subprocess per call). Each figure is also given as a ratio to its reference measured in
the same run. Run: ``python benchmarks/bench_foundation.py``; results go to
``benchmarks/results/foundation.json``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "foundation.json"
STARTS = 15
CALLS = 200

SHELL_START = """
import json, sys, time
t0 = time.perf_counter()
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
config = Config()
config.HistoryManager.hist_file = ":memory:"
shell = InteractiveShell.instance(config=config)
t1 = time.perf_counter()
if sys.argv[1] == "load":
    shell.run_line_magic("load_ext", "ipycloud")
t2 = time.perf_counter()
heavy = sorted({"torch", "pynvml", "ipywidgets", "kagglehub", "gdown"} & set(sys.modules))
print(json.dumps({"shell_s": t1 - t0, "load_ext_s": t2 - t1, "heavy": heavy}))
"""


def shell_starts(mode: str) -> list[dict[str, object]]:
    """Start a fresh interpreter STARTS times, bare or loading ipycloud, and time each part."""
    runs = []
    for _ in range(STARTS):
        started = time.perf_counter()
        output = subprocess.run([sys.executable, "-c", SHELL_START, mode], capture_output=True,
                                text=True, check=True).stdout
        run = json.loads(output)
        run["process_s"] = time.perf_counter() - started
        runs.append(run)
    return runs


def median(runs: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(run[key]) for run in runs)  # type: ignore[arg-type]


def gpuinfo_latency() -> dict[str, float]:
    """Cold and warm ``%gpuinfo`` (probe plus text and HTML rendering) in this process."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "ipycloud")

    def once() -> float:
        started = time.perf_counter()
        report = shell.run_line_magic("gpuinfo", "")
        shell.display_formatter.format(report)
        return time.perf_counter() - started

    cold = once()
    warm = sorted(once() for _ in range(CALLS))
    subprocess_floor = statistics.median(_time_subprocess() for _ in range(20))
    return {
        "cold_s": cold,
        "warm_median_s": statistics.median(warm),
        "warm_p95_s": warm[int(0.95 * len(warm))],
        "one_subprocess_s": subprocess_floor,
    }


def _time_subprocess() -> float:
    """The least a per-call ``nvidia-smi`` would cost: starting any process at all."""
    started = time.perf_counter()
    subprocess.run(["true"], check=True)
    return time.perf_counter() - started


def main() -> None:
    bare, loaded = shell_starts("bare"), shell_starts("load")
    latency = gpuinfo_latency()
    shell_s = median(bare, "shell_s")
    load_ext_s = median(loaded, "load_ext_s")
    results = {
        "machine": {"python": sys.version.split()[0], "gpu": "none (NVML unavailable)"},
        "load_ext": {
            "bare_shell_start_s": shell_s,
            "load_ext_added_s": load_ext_s,
            "ratio_to_bare_shell_start": load_ext_s / shell_s,
            "bare_process_s": median(bare, "process_s"),
            "loaded_process_s": median(loaded, "process_s"),
            "heavy_modules_after_load_ext": loaded[0]["heavy"],
            "goal_s": 0.050,
            "ratio_to_goal": load_ext_s / 0.050,
        },
        "gpuinfo": {
            **latency,
            "goal_s": 0.020,
            "ratio_to_goal": latency["warm_median_s"] / 0.020,
            "ratio_to_one_subprocess": latency["warm_median_s"] / latency["one_subprocess_s"],
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    lx, gi = results["load_ext"], results["gpuinfo"]
    print(f"%load_ext ipycloud adds {lx['load_ext_added_s'] * 1e3:.1f} ms to a bare shell start "
          f"of {lx['bare_shell_start_s'] * 1e3:.1f} ms (x{lx['ratio_to_bare_shell_start']:.2f}; "
          f"goal 50 ms, x{lx['ratio_to_goal']:.2f} of it); heavy modules imported: "
          f"{lx['heavy_modules_after_load_ext'] or 'none'}")
    print(f"%gpuinfo warm median {gi['warm_median_s'] * 1e3:.2f} ms, p95 "
          f"{gi['warm_p95_s'] * 1e3:.2f} ms (goal 20 ms, x{gi['ratio_to_goal']:.2f} of it; "
          f"x{gi['ratio_to_one_subprocess']:.2f} of starting one subprocess); "
          f"cold {gi['cold_s'] * 1e3:.0f} ms")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
