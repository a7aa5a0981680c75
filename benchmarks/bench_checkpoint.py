"""Benchmark: durable, asynchronous and verified checkpoints, and their cost to training.

Goals, each a ratio to a reference run in the same process, on the same disk:

1. A synchronous durable ``CheckpointManager.save`` is within 1.5x of a raw write of the
   same serialized bytes (open, write, flush, fsync, close).
2. An asynchronous save (``blocking=False``) blocks the caller for at most 10% of a plain
   synchronous ``torch.save`` + flush + fsync. The first asynchronous save allocates the
   host buffers, so first and steady-state saves are reported apart; the goal is for the
   steady state.
3. ``CheckpointManager.load`` (CRC-32 verification, ``torch.load(weights_only=True)``,
   every object checked, ``load_state_dict``) is within 1.1x of ``torch.load(weights_only=
   True)`` of the same file followed by the same ``load_state_dict`` calls, with the page
   cache cold (dropped) and warm. Two cases: a checkpoint whose checksum this process does
   not know (as in a fresh process: it is read beside ``torch.load``), and one it wrote or
   verified already, with its stat unchanged (not read again).
4. In a training loop that saves every LOOP_EVERY steps, a save with ``blocking="auto"``
   (what ``fit`` uses) costs the loop at most 1.1x the copy of the state into host buffers
   where it writes in the background, and never more than a blocking save. A forced
   background save (``blocking=False``) is measured beside it, written by the writer
   process (Linux) and, for comparison, by a thread in this process. So is a floor for any
   background writer: another process, at the same idle priority, writes and fsyncs as
   many bytes from its own memory (no copy, no serialisation). The loop trains a
   stack of residual MLP blocks (4.2M parameters: a ~48 MiB state with Adam's moments, the
   size of a small BERT) on the CPU, once with all of torch's threads (every core busy)
   and once with a core to spare (what a loop whose math runs on a GPU leaves). The cost
   of a save is paired within each run: the time the save blocks the loop, plus what the
   steps taken while it is written take over the run's typical step (the median of the
   steps with no write in flight). A save every LOOP_EVERY steps leaves the write time to
   end before the next one, as a real checkpoint interval does.

The state of goals 1-3 is an MLP of two 4096x4096 layers (33.6M parameters) and its Adam
optimizer after one step: parameters, ``exp_avg`` and ``exp_avg_sq`` make ~403 MB. Before
every timed operation of goals 1-3:

- dirty pages are written back (``os.sync``), so no run pays for the writeback of another;
- cold loads start with the page cache dropped, where this process may (root); warm loads
  start with the file read once; saves do not read, so the cache is left as it is;
- WARM_MEMORY_BYTES are touched and freed. A VM with free page reporting (such as the
  Firecracker VM this was written on) hands freed guest memory back to its host, and the
  next touch costs a host fault per page: without this step, whichever side followed a
  large free (a deleted file, a dropped cache, freed tensors) paid up to ~1 s more for a
  403 MB write to the page cache. With it, an occasional slow round remains.

Each figure is the median of ROUNDS rounds, the manager and its reference timed back to
back in each round, in an order that alternates from round to round; the spread is the
quartiles of the rounds. The load ratios and the loop's costs are paired: the median of
each round's ratio (or difference) to its own reference, so that drift between rounds on
this shared VM does not count. Every sample is kept in the JSON.
Run: ``python benchmarks/bench_checkpoint.py``; results go to
``benchmarks/results/checkpoint.json``. MB are 10^6 bytes.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from figures import write_results
from torch import nn

from ipycloud.runtime.checkpoint import (
    CheckpointInfo,
    CheckpointManager,
    integrity,
    writer_process,
)
from ipycloud.runtime.checkpoint.background import background_pays_off, tensor_devices
from ipycloud.runtime.checkpoint.manager import Blocking
from ipycloud.runtime.checkpoint.state import HostBuffers, capture
from ipycloud.runtime.per_process import reset_process_state

RESULTS = Path(__file__).parent / "results" / "checkpoint.json"
SCRATCH_PARENT = Path("/var/tmp")  # a real disk, unlike /dev/shm or a tmpfs /tmp
ROUNDS = 7
WIDTH = 4096
WARM_MEMORY_BYTES = 2 << 30  # well over what a save or a cold load fills: file + tensors
GOAL_SYNC_RATIO = 1.5
GOAL_ASYNC_RATIO = 0.10
GOAL_LOAD_RATIO = 1.1
GOAL_LOOP_COPY_RATIO = 1.1  # async cost to the loop / host-buffer copy
LOOP_WIDTH, LOOP_BLOCKS, LOOP_BATCH = 512, 4, 32
LOOP_STEPS, LOOP_EVERY = 160, 20  # saves at steps 20, 40, ..., 140
LOOP_ROUNDS = 8
# A mode of the loop -> what it passes as save(blocking=...)
SAVING_MODES: dict[str, Blocking] = {"blocking": True, "background": False, "auto": "auto",
                                     "background_thread": False}
BARE_WRITE = "bare_write"  # the floor: another process writes as many bytes, nothing else
LOOP_MODES = (*SAVING_MODES, BARE_WRITE)
# The floor's writer: a request byte in, the file written and fsynced, a reply byte out.
BARE_WRITER_CODE = """
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
data = os.urandom(size)
while sys.stdin.buffer.read(1):
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    sys.stdout.buffer.write(b".")
    sys.stdout.buffer.flush()
"""
Saver = tuple[Callable[[int], object], Callable[[], bool]]  # save(step), writing()

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
        self.auto_writes_in_background: dict[str, bool] = {}
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

    def load(self, round_number: int) -> None:
        assert self.last_info is not None
        info = self.last_info

        def reference_load() -> None:
            payload = torch.load(info.data_path, weights_only=True)
            load_state_dicts(self.state, payload["state"])

        def forget_checksums() -> None:  # what a fresh process knows
            reset_process_state()

        def know_checksum() -> None:  # verified before, as a process that wrote it
            reset_process_state()
            if integrity.problem(info) is not None or not integrity.trusted(info):
                raise RuntimeError(f"{info.name} should verify and then be trusted")

        cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
            ("reference", lambda: None, reference_load),
            ("manager_unknown", forget_checksums, lambda: self.sync_manager.load(
                self.state, which=info.step)),
            ("manager_known", know_checksum, lambda: self.sync_manager.load(
                self.state, which=info.step)),
            ("verify", forget_checksums, lambda: integrity.problem(info)),
        ]
        shift = round_number % len(cases)
        for cache in ("cold", "warm"):
            for name, prepare, action in cases[shift:] + cases[:shift]:
                prepare()
                self.settle(drop_cache=cache == "cold",
                            cached=info.data_path if cache == "warm" else None)
                self.record(f"load_{cache}_{name}_s", timed(action))


# -- a training loop that checkpoints ---------------------------------------------------------

class Block(nn.Module):
    """A transformer's feed-forward half: LayerNorm, widen, GELU, narrow, residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs + self.down(nn.functional.gelu(self.up(self.norm(inputs))))


class TrainingLoop:
    """LOOP_STEPS Adam steps of a residual MLP, checkpointed every LOOP_EVERY steps."""

    def __init__(self, scratch: Path) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(*(Block(LOOP_WIDTH) for _ in range(LOOP_BLOCKS)))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.inputs = torch.randn(LOOP_BATCH, LOOP_WIDTH)
        self.targets = torch.randn(LOOP_BATCH, LOOP_WIDTH)
        self.state: State = {"model": self.model, "optimizer": self.optimizer}
        self.scratch = scratch
        for _ in range(3):
            self.step()  # Adam's moments exist: the state has its full size
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.samples: dict[str, list[float]] = {}
        self.auto_writes_in_background: dict[str, bool] = {}

    def step(self) -> None:
        loss = nn.functional.mse_loss(self.model(self.inputs), self.targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def run(self, mode: str, label: str) -> None:
        """Train LOOP_STEPS steps, saving every LOOP_EVERY; record each save's cost."""
        saver = bare_writer if mode == BARE_WRITE else self.manager_saver
        with saver(self.scratch / label / mode, self.parameters * 12) as (save, writing):
            typical_steps: list[float] = []
            saves: list[tuple[float, list[float]]] = []  # blocked, steps while writing
            for step in range(1, LOOP_STEPS + 1):
                in_flight = writing()
                seconds = timed(self.step)
                (saves[-1][1] if in_flight else typical_steps).append(seconds)
                if step % LOOP_EVERY == 0 and step < LOOP_STEPS:
                    saves.append((timed(partial(save, step)), []))
        typical = statistics.median(typical_steps)
        self.record(f"{label}_{mode}_cost_s", *(blocked + sum(steps) - typical * len(steps)
                                                for blocked, steps in saves))
        self.record(f"{label}_{mode}_blocked_s", *(blocked for blocked, _ in saves))
        self.record(f"{label}_{mode}_steps_while_writing", *(len(steps) for _, steps in saves))
        self.record(f"{label}_{mode}_typical_step_s", typical)

    @contextlib.contextmanager
    def manager_saver(self, folder: Path, size: int) -> Iterator[Saver]:
        """Saves by a CheckpointManager in the mode named by ``folder``. A first save outside
        the timing makes the folder, the host buffers and the writer exist as in a long run."""
        del size  # the state decides it
        blocking = SAVING_MODES[folder.name]
        with thread_writes(folder.name == "background_thread"):
            manager = CheckpointManager(folder, keep_last=2)
            manager.save(self.state, 0, blocking=blocking)
            manager.wait()
            os.sync()
            yield (lambda step: manager.save(self.state, step, blocking=blocking),
                   lambda: manager.writing)
            manager.close()

    def host_copy(self, label: str) -> None:
        """The copy of the state into reused host buffers, as an asynchronous save makes it."""
        buffers = HostBuffers()
        buffers.copy(capture(self.state).saved)
        for _ in range(5):
            self.record(f"{label}_host_copy_s",
                        timed(lambda: buffers.copy(capture(self.state).saved)))

    def record(self, name: str, *seconds: float) -> None:
        self.samples.setdefault(name, []).extend(seconds)

    def measure(self, threads: int, label: str) -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            self.auto_writes_in_background[label] = background_pays_off(
                tensor_devices(capture(self.state).saved))
            for round_number in range(LOOP_ROUNDS):
                shift = round_number % len(LOOP_MODES)
                for mode in LOOP_MODES[shift:] + LOOP_MODES[:shift]:
                    self.run(mode, label)
                self.host_copy(label)
        finally:
            torch.set_num_threads(previous)


def loop_results(loop: TrainingLoop, label: str, threads: int) -> dict[str, Any]:
    def med(name: str) -> float:
        return statistics.median(loop.samples[f"{label}_{name}"])

    cost = {mode: med(f"{mode}_cost_s") for mode in LOOP_MODES}
    copy = med("host_copy_s")
    in_background = loop.auto_writes_in_background[label]
    background_modes = ("background", "background_thread", "auto", BARE_WRITE)
    return {
        "torch_threads": threads,
        "auto_writes": "in the background" if in_background else "in the foreground",
        "typical_step_s": {mode: med(f"{mode}_typical_step_s") for mode in LOOP_MODES},
        "cost_per_save_s": cost,
        "cost_per_save_quartiles_s": {mode: quartiles(loop.samples[f"{label}_{mode}_cost_s"])
                                      for mode in LOOP_MODES},
        "save_blocks_caller_s": {mode: med(f"{mode}_blocked_s") for mode in LOOP_MODES},
        "steps_while_writing": {mode: med(f"{mode}_steps_while_writing")
                                for mode in LOOP_MODES},
        "host_copy_s": copy,
        "cost_to_host_copy": {mode: cost[mode] / copy for mode in background_modes},
        "cost_to_blocking_cost": {mode: cost[mode] / cost["blocking"]
                                  for mode in background_modes},
        # In the foreground, auto takes the blocking path itself: their gap is the noise.
        "auto_goal_met": cost["auto"] <= GOAL_LOOP_COPY_RATIO * copy
        and cost["auto"] <= cost["blocking"] if in_background else None,
    }


@contextlib.contextmanager
def bare_writer(folder: Path, size: int) -> Iterator[Saver]:
    """The floor: a process that writes and fsyncs ``size`` bytes of its own memory to one
    file in ``folder`` at each save, its replies read without blocking."""
    folder.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-c", BARE_WRITER_CODE, str(folder / "data"),
                              str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    requests, replies = child.stdin, child.stdout
    pending = 0

    def save(_step: int) -> None:
        nonlocal pending
        requests.write(b".")
        requests.flush()
        pending += 1

    def writing() -> bool:
        nonlocal pending
        if pending:
            with contextlib.suppress(BlockingIOError):  # no reply yet
                pending -= len(os.read(replies.fileno(), 16))
        return pending > 0

    save(0)  # the first write, untimed, as the manager's first save
    os.read(replies.fileno(), 1)
    pending = 0
    os.set_blocking(replies.fileno(), False)
    try:
        yield save, writing
    finally:
        requests.close()
        child.wait()


@contextlib.contextmanager
def thread_writes(enabled: bool) -> Iterator[None]:
    """Within the block, background saves are written by a thread of this process, as on
    systems without the writer process."""
    if not enabled:
        yield
        return
    with mock.patch.object(writer_process, "supported", return_value=False):
        yield


def quartiles(samples: list[float]) -> list[float]:
    """The first and third quartiles: the spread of the rounds."""
    first, _, third = statistics.quantiles(samples, n=4)
    return [first, third]


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


def results_of(bench: Bench, parameters: int, loop: TrainingLoop,
               regimes: list[tuple[str, int]]) -> dict[str, Any]:
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
        load[cache] = {"reference_torch_load_and_load_state_dict": figure(reference,
                                                                          reference, size)}
        for case in ("unknown", "known"):
            samples = bench.samples[f"load_{cache}_manager_{case}_s"]
            ratios = [seconds / alone for seconds, alone in
                      zip(samples, bench.samples[f"load_{cache}_reference_s"], strict=True)]
            ratio = statistics.median(ratios)
            load[cache][f"manager_checksum_{case}"] = {
                **figure(statistics.median(samples), reference, size),
                "quartiles_s": quartiles(samples),
                "paired_ratio": ratio, "paired_ratio_quartiles": quartiles(ratios),
                "goal_met": ratio <= GOAL_LOAD_RATIO}
        load[cache]["reference_quartiles_s"] = quartiles(
            bench.samples[f"load_{cache}_reference_s"])
        load[cache]["crc32_verification_alone_s"] = median(bench, f"load_{cache}_verify_s")
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
                               "torch.load, in a second thread, unless this process knows "
                               "it), checks every object before restoring any, and restores "
                               "the RNG states"},
        "training_loop": {
            "parameters": loop.parameters, "state_mib": loop.parameters * 12 / 2 ** 20,
            "steps": LOOP_STEPS, "save_every": LOOP_EVERY, "rounds": LOOP_ROUNDS,
            "batch": LOOP_BATCH,
            "goal": f"async cost <= {GOAL_LOOP_COPY_RATIO} x host copy and <= blocking cost",
            **{label: loop_results(loop, label, threads) for label, threads in regimes}},
        "samples": {**bench.samples, **loop.samples},
    }


def print_summary(results: dict[str, Any]) -> None:
    def line(label: str, item: dict[str, float], goal: str = "") -> str:
        return (f"  {label:<38} {item['seconds']:7.3f} s  x{item['ratio_to_reference']:5.2f}  "
                f"{item['mb_per_s']:7.0f} MB/s  {goal}")

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    def spread(bounds: list[float]) -> str:
        return f"[{bounds[0]:.3f}..{bounds[1]:.3f}]"

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
        print(f"load, {cache} page cache (quartiles in brackets)")
        print(line("torch.load + load_state_dict",
                   figures["reference_torch_load_and_load_state_dict"],
                   spread(figures["reference_quartiles_s"])))
        for case, words in (("unknown", "checksum read"), ("known", "checksum known")):
            item = figures[f"manager_checksum_{case}"]
            print(line(f"CheckpointManager.load, {words}", item,
                       f"{spread(item['quartiles_s'])} paired x{item['paired_ratio']:.2f} "
                       f"{spread(item['paired_ratio_quartiles'])}, goal x{GOAL_LOAD_RATIO}: "
                       f"{verdict(item['goal_met'])}"))
        print(f"  {'CRC-32 verification alone':<38} "
              f"{figures['crc32_verification_alone_s']:7.3f} s  (runs beside torch.load)")
    loop = results["training_loop"]
    print(f"training loop: {loop['state_mib']:.0f} MiB state, {LOOP_STEPS} steps, a save every "
          f"{LOOP_EVERY}; cost per save = blocked + extra time of the steps while writing")
    for label in ("all_cores", "core_to_spare"):
        item = loop[label]
        rates = ", ".join(f"{mode} {seconds * 1e3:.1f} ms"
                          for mode, seconds in item["typical_step_s"].items())
        costs = ", ".join(
            f"{mode} {seconds * 1e3:.0f} ms "
            f"[{item['cost_per_save_quartiles_s'][mode][0] * 1e3:.0f}.."
            f"{item['cost_per_save_quartiles_s'][mode][1] * 1e3:.0f}]"
            for mode, seconds in item["cost_per_save_s"].items())
        print(f"  {label} ({item['torch_threads']} torch threads; auto writes "
              f"{item['auto_writes']}): typical step {rates}")
        print(f"    cost per save: {costs}; host copy {item['host_copy_s'] * 1e3:.1f} ms")
        for mode in ("background", "background_thread", "auto", BARE_WRITE):
            print(f"    {mode}: x{item['cost_to_host_copy'][mode]:.2f} of the host copy, "
                  f"x{item['cost_to_blocking_cost'][mode]:.2f} of a blocking save")
        met = item["auto_goal_met"]
        print("    goal for auto: " + ("the blocking path itself" if met is None
                                       else verdict(met)))
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
            bench.load(round_number)
        del state, bench.state
        back_free_memory()
        loop = TrainingLoop(scratch)
        cores = torch.get_num_threads()
        regimes = [("all_cores", cores), ("core_to_spare", max(1, cores - 1))]
        for label, threads in regimes:
            loop.measure(threads, label)
        results = results_of(bench, parameters, loop, regimes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_results(RESULTS, results)
    print_summary(results)


if __name__ == "__main__":
    main()
