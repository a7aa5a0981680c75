"""Benchmark: what the background sampler costs, as a share of one CPU core, at 1 Hz and 10 Hz.

Goals: at most 0.1% of one core at 1 Hz (what runs from ``%load_ext ipycloud`` on) and 1% at
10 Hz. The shared sampler runs the real ``take_sample`` probe with the usage totals attached
(``start_monitoring()``, as ``%load_ext`` does) for a while at each rate; a subscriber on the
sampler thread reads ``time.thread_time()`` at every tick, so the figure is the thread's own
CPU time (probe, history, usage totals, delivery and the wait between ticks), per second of
wall time. The whole process's
CPU time over the same window, against an idle window without the sampler, is given beside
it, and so is the cost of each part of one sample. Run: ``python benchmarks/bench_sampler.py``;
results go to ``benchmarks/results/sampler.json``.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import threading
import time
import timeit
from pathlib import Path

import psutil
from figures import percentile, write_results

from ipycloud.runtime.machine import nvml
from ipycloud.runtime.machine.cgroup import read_cgroup_limits
from ipycloud.runtime.monitor.probe import Probe, _memory, disks_of
from ipycloud.runtime.monitor.samples import Sample
from ipycloud.runtime.monitor.session import start_monitoring, stop_monitoring

RESULTS = Path(__file__).parent / "results" / "sampler.json"
RATES = {"1 Hz": (1.0, 60.0, 0.1), "10 Hz": (0.1, 20.0, 1.0)}  # interval, seconds, goal %
PART_CALLS = 2000


def run_at(interval: float, seconds: float) -> dict[str, float]:
    """Sample at ``interval`` for ``seconds``; the sampler thread's and the process's CPU."""
    ticks: list[tuple[float, float]] = []  # (perf_counter, thread_time) at each tick
    done = threading.Event()

    def record(sample: Sample) -> None:
        ticks.append((time.perf_counter(), time.thread_time()))
        if ticks[-1][0] - ticks[0][0] >= seconds:
            done.set()

    sampler = start_monitoring()  # the usage totals, as from %load_ext
    subscription = sampler.subscribe(record, interval=interval)
    while len(ticks) < 2:  # the first tick creates the probe: not part of the steady cost
        time.sleep(interval / 10)
    process_start, wall_start = time.process_time(), time.perf_counter()
    done.wait()
    process_cpu, wall = time.process_time() - process_start, time.perf_counter() - wall_start
    subscription.cancel()
    stop_monitoring()
    while sampler.running:
        time.sleep(0.01)
    steady = ticks[1:]
    thread_cpu = steady[-1][1] - steady[0][1]
    window = steady[-1][0] - steady[0][0]
    per_tick = [b[1] - a[1] for a, b in itertools.pairwise(steady)]
    return {
        "interval_s": interval,
        "seconds": window,
        "ticks": len(steady) - 1,
        "thread_cpu_s": thread_cpu,
        "core_percent": thread_cpu / window * 100,
        "per_sample_mean_us": thread_cpu / (len(steady) - 1) * 1e6,
        "per_sample_median_us": statistics.median(per_tick) * 1e6,
        "per_sample_p95_us": percentile(per_tick, 0.95) * 1e6,
        "process_cpu_percent": process_cpu / wall * 100,
    }


def idle_process_cpu(seconds: float) -> float:
    """The process's CPU use, percent of one core, while it sleeps without the sampler."""
    start = time.process_time()
    time.sleep(seconds)
    return (time.process_time() - start) / seconds * 100


def parts() -> dict[str, float]:
    """Microseconds per call of each part of one sample, in a tight loop on this thread.

    Warm caches make these cheaper than the same calls once a second on the sampler thread.
    """
    probe = Probe()
    process = psutil.Process()
    working = os.getcwd()
    calls = {
        "take_sample": probe.read,
        "cpu_times": psutil.cpu_times,
        "ram_and_swap": _memory,
        "psutil_virtual_and_swap_memory (replaced by ram_and_swap)":
            lambda: (psutil.virtual_memory(), psutil.swap_memory()),
        "disks": lambda: disks_of((("working", working),)),
        "process_rss": process.memory_info,
        "gpus_nvml": nvml.GpuReader().read,
    }
    return {name: timeit.timeit(call, number=PART_CALLS) / PART_CALLS * 1e6
            for name, call in calls.items()}


def main() -> None:
    gpus = nvml.snapshot(with_processes=False)
    gpu = (f"none ({gpus.unavailable_reason})" if gpus.unavailable_reason else
           f"{len(gpus.devices)} visible")
    limits = read_cgroup_limits()
    rates = {}
    for name, (interval, seconds, goal) in RATES.items():
        rate = run_at(interval, seconds)
        rates[name] = {**rate, "goal_percent": goal, "ratio_to_goal": rate["core_percent"] / goal}
    idle = idle_process_cpu(RATES["10 Hz"][1])
    parts_us = parts()
    results = {
        "machine": {
            "python": sys.version.split()[0],
            "cpus": psutil.cpu_count(),
            "cgroup_memory_limit": limits.memory_limit,
            "cgroup_cpu_limit": limits.cpu_limit,
            "gpu": gpu,
        },
        "rates": rates,
        "idle_process_cpu_percent": idle,
        "parts_us": parts_us,
    }
    write_results(RESULTS, results)
    print(f"GPU: {gpu}")
    for name, rate in rates.items():
        print(f"{name}: sampler thread {rate['core_percent']:.4f}% of one core "
              f"(goal {rate['goal_percent']}%, x{rate['ratio_to_goal']:.2f} of it); "
              f"{rate['per_sample_mean_us']:.0f} us per sample (median "
              f"{rate['per_sample_median_us']:.0f}, p95 {rate['per_sample_p95_us']:.0f}) over "
              f"{rate['ticks']} samples; whole process {rate['process_cpu_percent']:.4f}% "
              f"(idle without sampler {idle:.4f}%)")
    print("one sample by part, us: " + ", ".join(
        f"{name} {us:.1f}" for name, us in parts_us.items()))
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
