"""Benchmark: durable, asynchronous and verified checkpoints of a ~400 MB training state.

Goals, each a ratio to a reference run in the same process, on the same disk:

1. A synchronous durable ``CheckpointManager.save`` is within 1.5x of a raw write of the
   same serialized bytes (open, write, flush, fsync, close).
2. An asynchronous save (``blocking=False``) blocks the caller for at most 10% of a plain
   synchronous ``torch.save`` + flush + fsync. The first asynchronous save allocates the
   host buffers, so first and steady-state saves are reported apart; the goal is for the
   steady state.
3. ``CheckpointManager.load`` (CRC-32 verification beside ``torch.load(weights_only=True)``,
   ``load_state_dict``) is within 1.1x of ``torch.load(weights_only=True)`` of the same file
   followed by the same ``load_state_dict`` calls; the share of verification is reported.

The state is an MLP of two 4096x4096 layers (33.6M parameters) and its Adam optimizer after
one step: parameters, ``exp_avg`` and ``exp_avg_sq`` make ~403 MB. Before every timed
operation:

- dirty pages are written back (``os.sync``), so no run pays for the writeback of another;
- cold loads start with the page cache dropped, where this process may (root); warm loads
  start with the file read once; saves do not read, so the cache is left as it is;
- WARM_MEMORY_BYTES are touched and freed. A VM with free page reporting (such as the
  Firecracker VM this was written on) hands freed guest memory back to its host, and the
  next touch costs a host fault per page: without this step, whichever side followed a
  large free (a deleted file, a dropped cache, freed tensors) paid up to ~1 s more for a
  403 MB write to the page cache. With it, an occasional slow round remains.

Each figure is the median of ROUNDS rounds, the manager and its reference timed back to
back in each round; every sample is kept in the JSON.
Run: ``python benchmarks/bench_checkpoint.py``; results go to
``benchmarks/results/checkpoint.json``. MB are 10^6 bytes.
"""

from __future__ import annotations

import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ipycloud.runtime.checkpoint import CheckpointInfo, CheckpointManager, integrity

RESULTS = Path(__file__).parent / "results" / "checkpoint.json"
SCRATCH_PARENT = Path("/var/tmp")  # a real disk, unlike /dev/shm or a tmpfs /tmp
ROUNDS = 7
WIDTH = 4096
WARM_MEMORY_BYTES = 2 << 30  # well over what a save or a cold load fills: file + tensors
GOAL_SYNC_RATIO = 1.5
GOAL_ASYNC_RATIO = 0.10
GOAL_LOAD_RATIO = 1.1

State = dict[str, Any]


# -- set-up -----------------------------------------------------------------------------------

def build_state() -> State:
    """A model and an Adam optimizer that has taken one step, so its moments exist."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, WIDTH))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, WIDTH)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": optimizer}


def state_dicts(state: State) -> dict[str, Any]:
    """What a hand-written checkpoint would save: each object's state_dict()."""
    return {name: obj.state_dict() for name, obj in state.items()}


def load_state_dicts(state: State, saved: dict[str, Any]) -> None:
    for name, obj in state.items():
        obj.load_state_dict(saved[name])


def drop_caches() -> bool:
    """Write back dirty pages and drop the page cache; False when this process may not."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def back_free_memory() -> None:
    """Touch WARM_MEMORY_BYTES and free them: the next allocations find memory the host backs."""
    block = torch.empty(WARM_MEMORY_BYTES, dtype=torch.uint8)
    block.fill_(1)
    del block


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def fsync_file_write(path: Path, produce: Callable[[io.BufferedWriter], object]) -> float:
    """Seconds to create ``path``, fill it through ``produce``, flush, fsync and close it."""
    started = time.perf_counter()
    with open(path, "xb") as file:
        produce(file)
        file.flush()
        os.fsync(file.fileno())
    return time.perf_counter() - started


def read_whole(path: Path) -> None:
    """Bring a file into the page cache."""
    with open(path, "rb") as file:
        while file.read(64 * 1024 * 1024):
            pass


# -- measurements -----------------------------------------------------------------------------

class Bench:
    """The state, its serialized bytes and a scratch folder, with one method per figure."""

    def __init__(self, state: State, scratch: Path) -> None:
        self.state = state
        self.scratch = scratch
        buffer = io.BytesIO()
        torch.save(state_dicts(state), buffer)
        self.reference_bytes = buffer.getvalue()
        self.cache_dropped = drop_caches()
        self.load_average = os.getloadavg()[0]
        self.sync_manager = CheckpointManager(scratch / "sync", keep_last=2)
        self.async_folder = scratch / "async"
        self.samples: dict[str, list[float]] = {}
        self.last_info: CheckpointInfo | None = None

    def record(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds)

    def settle(self, *, drop_cache: bool = False, cached: Path | None = None) -> None:
        """Prepare a timing: no pending writeback, the page cache as asked, memory backed."""
        if drop_cache:
            drop_caches()
        else:
            os.sync()
        if cached is not None:
            read_whole(cached)
        back_free_memory()

    def scratch_file(self, name: str) -> Path:
        path = self.scratch / name
        path.unlink(missing_ok=True)
        return path

    def sync_save(self, step: int) -> None:
        self.settle()
        self.record("sync_manager_s", timed(lambda: self.sync_manager.save(self.state, step)))
        self.last_info = self.sync_manager.wait()
        self.settle()
        path = self.scratch_file("raw.bin")
        self.record("sync_reference_s",
                    fsync_file_write(path, lambda file: file.write(self.reference_bytes)))
        path.unlink()

    def async_save(self, step: int) -> None:
        manager = CheckpointManager(self.async_folder, keep_last=2)  # fresh host buffers
        for phase, checkpoint_step in (("first", 2 * step), ("steady", 2 * step + 1)):
            self.settle()
            blocked = timed(partial(manager.save, self.state, checkpoint_step, blocking=False))
            self.record(f"async_{phase}_blocked_s", blocked)
            self.record(f"async_{phase}_until_durable_s", blocked + timed(manager.wait))
        del manager
        self.settle()
        path = self.scratch_file("reference.pt")
        self.record("async_reference_s",
                    fsync_file_write(path, lambda file: torch.save(state_dicts(self.state),
                                                                   file)))
        path.unlink()

    def load(self) -> None:
        assert self.last_info is not None
        info = self.last_info

        def manager_load() -> None:
            self.sync_manager.load(self.state, which=info.step)

        def reference_load() -> None:
            payload = torch.load(info.data_path, weights_only=True)
            load_state_dicts(self.state, payload["state"])

        for cache in ("cold", "warm"):
            for name, action in (("manager", manager_load), ("reference", reference_load)):
                self.settle(drop_cache=cache == "cold",
                            cached=info.data_path if cache == "warm" else None)
                self.record(f"load_{cache}_{name}_s", timed(action))
            self.settle(drop_cache=cache == "cold",
                        cached=info.data_path if cache == "warm" else None)
            self.record(f"load_{cache}_verify_s",
                        timed(lambda: integrity.problem(info)))


# -- report -----------------------------------------------------------------------------------

def median(bench: Bench, name: str) -> float:
    return statistics.median(bench.samples[name])


def figure(seconds: float, reference_s: float, size: int) -> dict[str, float]:
    return {"seconds": seconds, "ratio_to_reference": seconds / reference_s,
            "mb_per_s": size / 1e6 / seconds}


def machine_info(scratch: Path, cache_dropped: bool, load_average: float) -> dict[str, Any]:
    device = subprocess.run(["df", "--output=source,fstype", str(scratch)], capture_output=True,
                            text=True, check=False).stdout.split()[-2:]
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "scratch_folder": str(scratch.parent),
        "scratch_device": " ".join(device),
        "page_cache_dropped_before_cold_loads": cache_dropped,
        "load_average_1min_at_start": load_average,
    }


def results_of(bench: Bench, parameters: int) -> dict[str, Any]:
    assert bench.last_info is not None
    size = bench.last_info.files[bench.last_info.data_path.name]["size"]
    sync_ref = median(bench, "sync_reference_s")
    async_ref = median(bench, "async_reference_s")
    sync = figure(median(bench, "sync_manager_s"), sync_ref, size)
    first = figure(median(bench, "async_first_blocked_s"), async_ref, size)
    steady = figure(median(bench, "async_steady_blocked_s"), async_ref, size)
    load: dict[str, Any] = {}
    for cache in ("cold", "warm"):
        reference = median(bench, f"load_{cache}_reference_s")
        manager = median(bench, f"load_{cache}_manager_s")
        load[cache] = {
            "manager": figure(manager, reference, size),
            "reference_torch_load_and_load_state_dict": figure(reference, reference, size),
            "crc32_verification_alone_s": median(bench, f"load_{cache}_verify_s"),
            "goal_met": manager / reference <= GOAL_LOAD_RATIO,
        }
    return {
        "machine": machine_info(bench.scratch, bench.cache_dropped, bench.load_average),
        "state": {"parameters": parameters, "checkpoint_file_bytes": size,
                  "reference_bytes": len(bench.reference_bytes), "rounds": ROUNDS},
        "sync_save": {
            "manager": sync,
            "reference_raw_write_fsync": figure(sync_ref, sync_ref, len(bench.reference_bytes)),
            "goal_ratio": GOAL_SYNC_RATIO,
            "goal_met": sync["ratio_to_reference"] <= GOAL_SYNC_RATIO,
        },
        "async_save": {
            "first_save_blocked": first,
            "steady_state_blocked": steady,
            "first_save_until_durable_s": median(bench, "async_first_until_durable_s"),
            "steady_state_until_durable_s": median(bench, "async_steady_until_durable_s"),
            "reference_torch_save_fsync": figure(async_ref, async_ref, size),
            "goal_ratio": GOAL_ASYNC_RATIO,
            "goal_met": steady["ratio_to_reference"] <= GOAL_ASYNC_RATIO,
        },
        "load": {**load, "goal_ratio": GOAL_LOAD_RATIO,
                 "both_sides": "torch.load(weights_only=True) of the same file, then "
                               "load_state_dict into the same model and optimizer; the "
                               "manager also reads the manifests, verifies the CRC-32 (beside "
                               "torch.load, in a second thread) and restores the RNG states"},
        "samples": bench.samples,
    }


def print_summary(results: dict[str, Any]) -> None:
    def line(label: str, item: dict[str, float], goal: str = "") -> str:
        return (f"  {label:<38} {item['seconds']:7.3f} s  x{item['ratio_to_reference']:5.2f}  "
                f"{item['mb_per_s']:7.0f} MB/s  {goal}")

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    state, sync, asy, load = (results[key] for key in ("state", "sync_save", "async_save",
                                                         "load"))
    print(f"state {state['checkpoint_file_bytes'] / 1e6:.0f} MB "
          f"({state['parameters'] / 1e6:.1f}M parameters + Adam), medians of "
          f"{state['rounds']} rounds; page cache dropped before cold loads: "
          f"{results['machine']['page_cache_dropped_before_cold_loads']}")
    busy = results["machine"]["load_average_1min_at_start"]
    if busy > 1.0:
        print(f"note: load average {busy:.1f} at the start: if other work shares the machine "
              "(not just a run that ended moments ago), these figures are unreliable")
    print("synchronous durable save")
    print(line("raw write + fsync of the same bytes", sync["reference_raw_write_fsync"]))
    print(line("CheckpointManager.save", sync["manager"],
               f"goal x{GOAL_SYNC_RATIO}: {verdict(sync['goal_met'])}"))
    print("asynchronous save: time the caller is blocked")
    print(line("torch.save + flush + fsync", asy["reference_torch_save_fsync"]))
    print(line("save(blocking=False), first save", asy["first_save_blocked"]))
    print(line("save(blocking=False), steady state", asy["steady_state_blocked"],
               f"goal x{GOAL_ASYNC_RATIO}: {verdict(asy['goal_met'])}"))
    print(f"  {'until durable (first / steady)':<38} {asy['first_save_until_durable_s']:7.3f}"
          f" s / {asy['steady_state_until_durable_s']:.3f} s")
    for cache in ("cold", "warm"):
        figures = load[cache]
        print(f"load, {cache} page cache")
        print(line("torch.load + load_state_dict",
                   figures["reference_torch_load_and_load_state_dict"]))
        print(line("CheckpointManager.load", figures["manager"],
                   f"goal x{GOAL_LOAD_RATIO}: {verdict(figures['goal_met'])}"))
        print(f"  {'CRC-32 verification alone':<38} "
              f"{figures['crc32_verification_alone_s']:7.3f} s  (runs beside torch.load)")
    print(f"written to {RESULTS}")


def main() -> None:
    state = build_state()
    parameters = sum(p.numel() for p in state["model"].parameters())
    scratch = Path(tempfile.mkdtemp(prefix="ipycloud-bench-checkpoint-", dir=SCRATCH_PARENT))
    try:
        bench = Bench(state, scratch)
        for round_number in range(ROUNDS):
            bench.sync_save(round_number)
            bench.async_save(round_number)
            bench.load()
        results = results_of(bench, parameters)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print_summary(results)


if __name__ == "__main__":
    main()
