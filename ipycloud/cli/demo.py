"""``ipycloud demo``: what ipycloud does, shown on this machine with built-in defaults.

It prints the environment report, then (when torch is installed) trains a small model on
synthetic data with ``ipycloud.fit`` on the best local device and precision, kills the
training process with SIGKILL after a few checkpoints, reruns it so that it resumes by
itself, and checks that the result equals an uninterrupted run bit for bit, while the
background sampler of ``%dashboard`` watches the machine. Everything happens in a
temporary folder, which is removed at the end.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ipycloud._version import __version__
from ipycloud.runtime._optional import is_available

Say = Callable[[str], object]


def run_demo(say: Say = print) -> int:
    """Run the demo, writing its story through ``say``; returns an exit status."""
    from ipycloud.runtime.machine.report import environment_report

    say(f"ipycloud {__version__}: what this machine offers for training\n")
    say(str(environment_report(processes=True)))
    if not is_available("torch"):
        say("\ntorch is not installed: pip install 'ipycloud[torch]' to see a training run "
            "survive a kill and resume bit for bit.")
        return 0
    from ipycloud.runtime.monitor.session import start_monitoring, stop_monitoring

    start_monitoring(interval=0.5)
    try:
        with tempfile.TemporaryDirectory(prefix="ipycloud-demo-") as folder:
            say(f"\nTraining with ipycloud.fit, in the temporary folder {folder}:")
            matches = _train_kill_resume(Path(folder), say)
        say(_usage_line())
    finally:
        stop_monitoring()
    say("\nIn a notebook: %load_ext ipycloud, then %gpuinfo, %dashboard, %checkpoint?, "
        "%mount_storage?, %keepalive? and ipycloud.fit? for help.")
    return 0 if matches else 1


def _usage_line() -> str:
    """What the background sampler saw during the runs, as %dashboard report totals it."""
    from ipycloud.runtime.monitor.usage import usage_report
    from ipycloud.runtime.units import format_duration, format_of

    usage = usage_report().to_dict()
    gpus = f", {usage['gpu_hours']:.3f} GPU-hours" if usage["gpu_count"] else ""
    return (f"- meanwhile the background sampler took {usage['samples']} readings over "
            f"{format_duration(usage['duration_s'])}: CPU {usage['cpu_average_percent']:.0f}% "
            f"on average, {usage['cpu_peak_percent']:.0f}% at peak; RAM at most "
            f"{format_of(usage['ram_peak'], usage['ram_limit'])}{gpus}")


def _train_kill_resume(folder: Path, say: Say) -> bool:
    import torch

    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(400, 6, generator=generator)
    torch.save({"inputs": inputs, "labels": inputs[:, :4].argmax(dim=1)}, folder / "data.pt")
    started = time.perf_counter()
    whole = _train(folder, "whole")
    say(f"- {_fit_line(whole)}")
    say(f"- an uninterrupted run: 40 optimizer steps, a checkpoint every 7 "
        f"({time.perf_counter() - started:.1f} s)")
    killed = _train(folder, "interrupted", "--kill-after-checkpoint", "2")
    if killed.returncode != -9:
        raise RuntimeError(f"the run to be killed ended with status {killed.returncode}:\n"
                           f"{killed.stderr[-2000:]}")
    say(f"- a second run was killed with SIGKILL (exit status {killed.returncode}) once its "
        "second checkpoint was written, while it went on training")
    resumed = _train(folder, "interrupted")
    say(f"- the same command again: {_fit_line(resumed)}")
    final = {name: torch.load(folder / f"{name}.pt", weights_only=True, map_location="cpu")
             for name in ("whole", "interrupted")}
    matches = all(
        torch.equal(a, b) for a, b in zip(final["whole"]["model"].values(),
                                          final["interrupted"]["model"].values(), strict=True))
    say(f"- the resumed run's final weights equal the uninterrupted run's, bit for bit: "
        f"{matches}")
    return matches


def _train(folder: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipycloud.cli.demo_training", str(folder / "data.pt"),
         str(folder / f"{name}-checkpoints"), str(folder / f"{name}.pt"), "--progress",
         *extra], capture_output=True, text=True, timeout=600)


def _fit_line(run: subprocess.CompletedProcess[str]) -> str:
    """What fit said about itself: device, precision and whether it resumed."""
    for line in (run.stdout + run.stderr).splitlines():
        if line.startswith("ipycloud.fit: "):
            return line.removeprefix("ipycloud.fit: ")
    raise RuntimeError(f"the training run failed (exit status {run.returncode}):\n"
                       f"{run.stderr[-2000:]}")
