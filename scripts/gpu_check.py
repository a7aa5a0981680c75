"""Prove ipycloud's GPU paths on this machine's GPUs: one command, no network, under 8
minutes on one GPU. Writes ``benchmarks/results/gpu_check.json``.

Each check passes, fails (with what it found) or is skipped (with why): on a machine
without an NVIDIA GPU the checks that need one say so, and those the CPU can run run there
(the test suite runs them so). The checks:

- ``gpuinfo``: ``%gpuinfo``'s report against ``nvidia-smi`` (names, memory, compute
  capability, driver), and no warning that this torch lacks kernels for the GPU;
- ``gpu_memory``: this process's GPU memory as the lab extension reads it per kernel (NVML,
  by process tree) against torch's allocator, after reserving 1 GiB;
- ``fit_speed``: ``fit`` against a hand-written loop on the same device and model, in bf16
  (where the GPU runs it natively) and fp16 with a GradScaler (fp32 on a CPU), steps/s of
  paired rounds; goal >= 0.97x;
- ``exact_resume``: a run paused after step 7 and resumed ends bit for bit as one never
  paused;
- ``background_save``: training time a background save blocks (pinned buffers on a GPU)
  against ``torch.save`` of the same state;
- ``out_of_memory``: a step that runs out of GPU memory raises torch's error with its
  message, and the checkpoints saved before it still load;
- ``launch``: ``launch(nprocs="auto")``: one rank per GPU over NCCL (two gloo ranks on a
  CPU), an all-reduce across them;
- ``compile``: ``fit(compile=True)``'s first step cold and from the caches a previous
  session saved, and compiled against eager steps/s (fresh interpreters).

Run: ``python scripts/gpu_check.py [--only NAME ...] [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.machine import nvml
from ipycloud.runtime.machine.report import environment_report
from ipycloud.runtime.monitor.processes import TreeMeter
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.distributed import launch
from ipycloud.runtime.train.interrupt import FitInterrupted
from ipycloud.runtime.train.loop import fit

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_check.json"
GOAL_FIT_VS_HAND_WRITTEN = 0.97
GOAL_WARM_VS_COLD = 0.25
GIB = 1024**3


class Skipped(Exception):
    """A check this machine cannot run; the message says why."""


def device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def needs_gpu() -> None:
    if device().type != "cuda":
        raise Skipped("no CUDA GPU here (torch.cuda.is_available() is False)")


def mlp(width: int = 1024) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.GELU(),
                               torch.nn.Linear(width, width), torch.nn.GELU(),
                               torch.nn.Linear(width, 10)).to(device())


def batches(count: int, size: int = 256) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(size, 256, generator=generator),
             torch.randint(0, 10, (size,), generator=generator)) for _ in range(count)]


# -- the checks ---------------------------------------------------------------------------


def check_gpuinfo(quick: bool) -> dict[str, Any]:
    needs_gpu()
    if shutil.which("nvidia-smi") is None:
        raise Skipped("nvidia-smi is not on PATH")
    fields = "name,memory.total,compute_cap,driver_version"
    listed = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,"
                             "nounits"], capture_output=True, text=True, check=True).stdout
    smi = [[part.strip() for part in line.split(",")] for line in listed.strip().splitlines()]
    report = environment_report()
    ours = [[gpu.name, str((gpu.memory_total or 0) // 2**20), gpu.compute_capability,
             report.snapshot.gpus.driver_version] for gpu in report.snapshot.gpus.devices]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    same = ours == smi if visible is None else len(ours) <= len(smi)
    return {"passed": same and not report.snapshot.build_problems, "nvidia_smi": smi,
            "gpuinfo": ours, "build_problems": list(report.snapshot.build_problems)}


def check_gpu_memory(quick: bool) -> dict[str, Any]:
    needs_gpu()
    held = torch.empty(GIB, dtype=torch.uint8, device=device())
    torch.cuda.synchronize()
    gpus = [(gpu.index, gpu.processes) for gpu in nvml.snapshot(with_processes=True).devices]
    tree = TreeMeter(1).read({"this": os.getpid()}, gpus)["this"]
    used = sum(share.used or 0 for share in tree.gpu_memory)
    reserved = torch.cuda.memory_reserved()
    del held
    torch.cuda.empty_cache()
    # NVML counts the CUDA context too (a few hundred MiB) beside what torch reserved.
    return {"passed": used >= reserved >= GIB, "nvml_process_tree_bytes": used,
            "torch_reserved_bytes": reserved}


def _hand_written(model: torch.nn.Module, data: list[Any], precision: str) -> float:
    optimizer = torch.optim.AdamW(model.parameters())
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(enabled=precision == "fp16")
    target = device()
    started = time.perf_counter()
    for step, (inputs, labels) in enumerate(data):
        inputs, labels = inputs.to(target, non_blocking=True), labels.to(target)
        with torch.autocast(target.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            loss.item()
    _synchronize()
    return len(data) / (time.perf_counter() - started)


def _with_fit(model: torch.nn.Module, data: list[Any], precision: str) -> float:
    started = time.perf_counter()
    fit(model, torch.optim.AdamW(model.parameters()), data, epochs=1, device=device(),
        precision=precision, progress=False)
    _synchronize()
    return len(data) / (time.perf_counter() - started)


def _synchronize() -> None:
    if device().type == "cuda":
        torch.cuda.synchronize()


def check_fit_speed(quick: bool) -> dict[str, Any]:
    if device().type == "cuda":
        native_bf16 = torch.cuda.get_device_capability()[0] >= 8
        precisions = (["bf16"] if native_bf16 else []) + ["fp16"]
    else:
        precisions = ["fp32"]
    data = batches(30 if quick else 300)
    figures: dict[str, Any] = {}
    for precision in precisions:
        _with_fit(mlp(), data[:10], precision)  # warm up kernels and allocator
        ratios = []
        for round_ in range(2 if quick else 7):
            loops = (_hand_written, _with_fit) if round_ % 2 == 0 else (_with_fit, _hand_written)
            rates = {loop.__name__: loop(mlp(), data, precision) for loop in loops}
            ratios.append(rates["_with_fit"] / rates["_hand_written"])
        figures[precision] = {"fit_vs_hand_written_paired": statistics.median(ratios),
                              "rounds": ratios}
    passed = all(entry["fit_vs_hand_written_paired"] >= GOAL_FIT_VS_HAND_WRITTEN
                 for entry in figures.values())
    return {"passed": passed, "goal": GOAL_FIT_VS_HAND_WRITTEN, **figures}


class PauseAfter(Callback):
    """Presses Ctrl-C after optimizer step ``step`` (fit saves, then raises
    FitInterrupted)."""

    every_step = True

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        if step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def _resumable_run(folder: Path, pause_at: int | None) -> dict[str, torch.Tensor] | None:
    model = mlp(256)
    model.insert(2, torch.nn.Dropout(0.1))  # draws from the generator on the device
    try:
        fit(model, torch.optim.AdamW(model.parameters()), batches(12, 64), epochs=2,
            device=device(), progress=False, checkpoint=folder, seed=3,
            callbacks=[PauseAfter(pause_at)])
    except FitInterrupted:
        return None
    return {name: tensor.cpu() for name, tensor in model.state_dict().items()}


def check_exact_resume(quick: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        whole = _resumable_run(Path(scratch, "whole"), None)
        paused = _resumable_run(Path(scratch, "paused"), 7)
        resumed = _resumable_run(Path(scratch, "paused"), None)
    assert whole is not None and resumed is not None
    different = [name for name in whole if not torch.equal(whole[name], resumed[name])]
    return {"passed": paused is None and not different, "different_tensors": different}


def check_background_save(quick: bool) -> dict[str, Any]:
    model = mlp(4096 if device().type == "cuda" else 1024)
    state = {"model": model}
    size = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        torch.save(model.state_dict(), Path(scratch, "plain.pt"))
        plain_s = time.perf_counter() - started
        manager = CheckpointManager(Path(scratch, "run"))
        manager.save(state, 0, blocking=False)  # starts the writer: once a session
        manager.wait()
        blocked = []
        for step in range(1, 3 if quick else 6):
            started = time.perf_counter()
            manager.save(state, step, blocking=False)
            blocked.append(time.perf_counter() - started)
            manager.wait()
        manager.close()
    return {"passed": statistics.median(blocked) < plain_s, "state_bytes": size,
            "torch_save_s": plain_s, "background_blocked_s": blocked}


class _HugeAt(torch.nn.Module):
    """Asks for far more GPU memory than there is at one step."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 5:
            torch.empty(1 << 50, dtype=torch.uint8, device=inputs.device)
        return self.inner(inputs)


def check_out_of_memory(quick: bool) -> dict[str, Any]:
    needs_gpu()
    with tempfile.TemporaryDirectory() as scratch:
        model = _HugeAt(mlp(256))
        try:
            fit(model, torch.optim.AdamW(model.parameters()), batches(8, 64), epochs=1,
                device=device(), progress=False, checkpoint=scratch, checkpoint_every_steps=2)
        except torch.OutOfMemoryError as error:
            message = str(error).splitlines()[0]
        else:
            return {"passed": False, "why": "no out-of-memory error was raised"}
        torch.cuda.empty_cache()
        info = CheckpointManager(scratch).load({"model": _HugeAt(mlp(256))},
                                               map_location="cpu", restore_rng=False)
    return {"passed": "out of memory" in message.lower() and info.step >= 2,
            "message": message, "latest_checkpoint_step": info.step}


def _all_reduce() -> dict[str, Any]:
    import torch.distributed as dist

    where = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")
    total = torch.tensor([float(dist.get_rank() + 1)], device=where)
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "backend": dist.get_backend(), "sum": total.item(),
            "device": torch.cuda.get_device_name(where) if where.type == "cuda" else "cpu"}


def check_launch(quick: bool) -> dict[str, Any]:
    ranks = launch(_all_reduce, nprocs="auto")
    expected = len(ranks) * (len(ranks) + 1) / 2
    return {"passed": all(rank["sum"] == expected for rank in ranks), "ranks": ranks}


COMPILE_SESSION = """
import json, sys, time, torch
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.loop import fit
sys.path.insert(0, {scripts!r})
from gpu_check import batches, device, mlp
stamps = []
class Stamps(Callback):
    every_step = True
    def on_step(self, step, logs):
        stamps.append(time.perf_counter())
model = mlp()
started = time.perf_counter()
fit(model, torch.optim.AdamW(model.parameters()), batches({steps}), epochs=1, device=device(),
    progress=False, checkpoint={folder!r}, callbacks=[Stamps()], compile={compile})
print(json.dumps({{"first_step_s": stamps[0] - started,
                  "steps_per_s": (len(stamps) - 11) / (stamps[-1] - stamps[10])}}))
"""


def _compile_session(folder: Path, compile_on: bool, steps: int) -> dict[str, float]:
    code = COMPILE_SESSION.format(scripts=str(Path(__file__).parent), steps=steps,
                                  folder=str(folder), compile=compile_on)
    with tempfile.TemporaryDirectory() as inductor:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor},
                              check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def check_compile(quick: bool) -> dict[str, Any]:
    if device().type == "cuda" and torch.cuda.get_device_capability() < (7, 0):
        raise Skipped("compile needs compute capability 7.0 or newer (Triton)")
    steps = 30 if quick else 200
    with tempfile.TemporaryDirectory() as scratch:
        cold = _compile_session(Path(scratch, "cold"), True, steps)
        Path(scratch, "warm").mkdir()
        shutil.copytree(Path(scratch, "cold", "compile-cache"),
                        Path(scratch, "warm", "compile-cache"))
        warm = _compile_session(Path(scratch, "warm"), True, steps)
        eager = _compile_session(Path(scratch, "eager"), False, steps)
    warm_vs_cold = warm["first_step_s"] / cold["first_step_s"]
    return {"passed": warm_vs_cold <= GOAL_WARM_VS_COLD, "goal_warm_vs_cold": GOAL_WARM_VS_COLD,
            "first_step_s": {"cold": cold["first_step_s"], "warm": warm["first_step_s"],
                             "eager": eager["first_step_s"]},
            "warm_vs_cold": warm_vs_cold,
            "compiled_vs_eager_steps_per_s": cold["steps_per_s"] / eager["steps_per_s"]}


CHECKS: dict[str, Callable[[bool], dict[str, Any]]] = {
    "gpuinfo": check_gpuinfo, "gpu_memory": check_gpu_memory, "fit_speed": check_fit_speed,
    "exact_resume": check_exact_resume, "background_save": check_background_save,
    "out_of_memory": check_out_of_memory, "launch": check_launch, "compile": check_compile,
}


def run_check(name: str, quick: bool) -> dict[str, Any]:
    """One check's outcome: "passed", "failed" (with what it found or the error) or
    "skipped" (with why), and its seconds."""
    started = time.monotonic()
    try:
        found = CHECKS[name](quick)
        outcome = {"status": "passed" if found.pop("passed") else "failed", **found}
    except Skipped as why:
        outcome = {"status": "skipped", "why": str(why)}
    except Exception as error:  # a check that breaks is a finding, not the end
        outcome = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
    outcome["seconds"] = round(time.monotonic() - started, 2)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    where = torch.cuda.get_device_name(0) if device().type == "cuda" else "cpu"
    results: dict[str, Any] = {"device": where, "torch": torch.__version__,
                               "cuda": torch.version.cuda, "quick": args.quick,
                               "when": time.strftime("%Y-%m-%d %H:%M"), "checks": {}}
    for name in args.only:
        results["checks"][name] = outcome = run_check(name, args.quick)
        print(f"{name}: {outcome['status']}"
              + (f" ({outcome.get('why') or outcome.get('error')})"
                 if outcome["status"] != "passed" and ("why" in outcome or "error" in outcome)
                 else ""), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")
    failed = [name for name, outcome in results["checks"].items()
              if outcome["status"] == "failed"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
