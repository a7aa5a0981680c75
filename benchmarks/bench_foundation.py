"""Benchmark: what ``%load_ext ipycloud`` adds to a shell start, and ``%gpuinfo`` cold and warm.

Goals: loading the extension (usage recording included) adds under 50 ms to a bare IPython
shell start and imports no torch; the first ``%gpuinfo`` in a fresh process takes at most
100 ms with torch installed and not imported, and leaves torch unimported; a warm
``%gpuinfo`` takes under 20 ms without a GPU (NVML queries, never a subprocess per call).
The cold call is measured in fresh processes, right after ``%load_ext`` (one cell, while
the usage sampler's thread loads its probe) and a second later (the next cell); its
reference is what it used to pay, ``import torch`` in a fresh shell. Each figure is also
given as a ratio to its reference measured in the same run. Run:
``python benchmarks/bench_foundation.py``; results go to ``benchmarks/results/foundation.json``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from figures import write_results

RESULTS = Path(__file__).parent / "results" / "foundation.json"
STARTS = 15
CALLS = 200
COLD_GOAL_S = 0.100

SHELL_START = """
import json, sys, time
t0 = time.perf_counter()
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
config = Config()
config.HistoryManager.hist_file = ":memory:"
config.UsageRecording.enabled = sys.argv[1] != "load-without-recording"
shell = InteractiveShell.instance(config=config)
t1 = time.perf_counter()
if sys.argv[1] != "bare":
    shell.run_line_magic("load_ext", "ipycloud")
t2 = time.perf_counter()
heavy = sorted({"torch", "pynvml", "ipywidgets", "kagglehub", "gdown"} & set(sys.modules))
print(json.dumps({"shell_s": t1 - t0, "load_ext_s": t2 - t1, "heavy": heavy}))
"""

COLD_GPUINFO = """
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
config = Config()
config.HistoryManager.hist_file = ":memory:"
shell = InteractiveShell.instance(config=config)
if sys.argv[1] == "import-torch":  # the reference: what the first %gpuinfo used to pay
    started = time.perf_counter()
    import torch
    print(json.dumps({"s": time.perf_counter() - started}))
    sys.exit()
shell.run_line_magic("load_ext", "ipycloud")
if sys.argv[1] == "next-cell":
    time.sleep(1.0)
started = time.perf_counter()
report = shell.run_line_magic("gpuinfo", "")
shell.display_formatter.format(report)
print(json.dumps({"s": time.perf_counter() - started, "torch_imported": "torch" in sys.modules,
                  "torch_reported": report.snapshot.software.torch.version}))
"""


def fresh_runs(script: str, mode: str) -> list[dict[str, Any]]:
    """Run ``script`` with ``mode`` in STARTS fresh interpreters; what each printed."""
    runs = []
    for _ in range(STARTS):
        started = time.perf_counter()
        output = subprocess.run([sys.executable, "-c", script, mode], capture_output=True,
                                text=True, check=True).stdout
        run = json.loads(output)
        run["process_s"] = time.perf_counter() - started
        runs.append(run)
    return runs


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(run[key]) for run in runs)


def gpuinfo_latency() -> dict[str, float]:
    """Warm ``%gpuinfo`` (probe plus text and HTML rendering) in this process."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "ipycloud")
    formatter = shell.display_formatter
    assert formatter is not None, "an InteractiveShell always has a display formatter"

    def once() -> float:
        started = time.perf_counter()
        report = shell.run_line_magic("gpuinfo", "")
        formatter.format(report)
        return time.perf_counter() - started

    once()
    warm = sorted(once() for _ in range(CALLS))
    subprocess_floor = statistics.median(_time_subprocess() for _ in range(20))
    return {
        "warm_median_s": statistics.median(warm),
        "warm_p95_s": warm[int(0.95 * len(warm))],
        "one_subprocess_s": subprocess_floor,
    }


def cold_gpuinfo() -> dict[str, Any]:
    """The first ``%gpuinfo`` of fresh processes, against ``import torch`` in one."""
    same_cell, next_cell = fresh_runs(COLD_GPUINFO, "same-cell"), fresh_runs(COLD_GPUINFO,
                                                                             "next-cell")
    import_torch = median(fresh_runs(COLD_GPUINFO, "import-torch"), "s")
    figures: dict[str, Any] = {}
    for name, runs in (("same_cell", same_cell), ("next_cell", next_cell)):
        cold = median(runs, "s")
        figures[f"{name}_median_s"] = cold
        figures[f"{name}_max_s"] = max(float(run["s"]) for run in runs)
        figures[f"{name}_ratio_to_goal"] = cold / COLD_GOAL_S
        figures[f"{name}_ratio_to_import_torch"] = cold / import_torch
    runs = same_cell + next_cell
    return {
        **figures,
        "import_torch_s": import_torch,
        "goal_s": COLD_GOAL_S,
        "torch_imported_after": sorted({bool(run["torch_imported"]) for run in runs}),
        "torch_reported": sorted({str(run["torch_reported"]) for run in runs}),
    }


def _time_subprocess() -> float:
    """The least a per-call ``nvidia-smi`` would cost: starting any process at all."""
    started = time.perf_counter()
    subprocess.run(["true"], check=True)
    return time.perf_counter() - started


def main() -> None:
    bare, loaded = fresh_runs(SHELL_START, "bare"), fresh_runs(SHELL_START, "load")
    unrecorded = fresh_runs(SHELL_START, "load-without-recording")
    latency = gpuinfo_latency()
    cold = cold_gpuinfo()
    shell_s = median(bare, "shell_s")
    load_ext_s = median(loaded, "load_ext_s")
    results: dict[str, Any] = {
        "machine": {"python": sys.version.split()[0], "gpu": "none (NVML unavailable)"},
        "load_ext": {
            "bare_shell_start_s": shell_s,
            "load_ext_added_s": load_ext_s,
            "load_ext_added_without_recording_s": median(unrecorded, "load_ext_s"),
            "ratio_to_bare_shell_start": load_ext_s / shell_s,
            "bare_process_s": median(bare, "process_s"),
            "loaded_process_s": median(loaded, "process_s"),
            "heavy_modules_after_load_ext": sorted({name for run in loaded
                                                    for name in run["heavy"]}),
            "goal_s": 0.050,
            "ratio_to_goal": load_ext_s / 0.050,
        },
        "gpuinfo": {
            **latency,
            "goal_s": 0.020,
            "ratio_to_goal": latency["warm_median_s"] / 0.020,
            "ratio_to_one_subprocess": latency["warm_median_s"] / latency["one_subprocess_s"],
        },
        "gpuinfo_cold": cold,
    }
    write_results(RESULTS, results)
    lx, gi = results["load_ext"], results["gpuinfo"]
    print(f"%load_ext ipycloud adds {lx['load_ext_added_s'] * 1e3:.1f} ms to a bare shell start "
          f"of {lx['bare_shell_start_s'] * 1e3:.1f} ms (x{lx['ratio_to_bare_shell_start']:.2f}; "
          f"goal 50 ms, x{lx['ratio_to_goal']:.2f} of it; "
          f"{lx['load_ext_added_without_recording_s'] * 1e3:.1f} ms without usage recording); "
          f"heavy modules seen right after it: {lx['heavy_modules_after_load_ext'] or 'none'}")
    print(f"%gpuinfo warm median {gi['warm_median_s'] * 1e3:.2f} ms, p95 "
          f"{gi['warm_p95_s'] * 1e3:.2f} ms (goal 20 ms, x{gi['ratio_to_goal']:.2f} of it; "
          f"x{gi['ratio_to_one_subprocess']:.2f} of starting one subprocess)")
    print(f"%gpuinfo cold, first call of a fresh process: median "
          f"{cold['same_cell_median_s'] * 1e3:.0f} ms in the cell of %load_ext (max "
          f"{cold['same_cell_max_s'] * 1e3:.0f}), {cold['next_cell_median_s'] * 1e3:.0f} ms in "
          f"the next cell (max {cold['next_cell_max_s'] * 1e3:.0f}); goal 100 ms, x"
          f"{cold['same_cell_ratio_to_goal']:.2f} / x{cold['next_cell_ratio_to_goal']:.2f} of "
          f"it; import torch alone {cold['import_torch_s'] * 1e3:.0f} ms (x"
          f"{cold['next_cell_ratio_to_import_torch']:.3f} of it); torch reported "
          f"{cold['torch_reported']}, imported afterwards: {cold['torch_imported_after']}")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
