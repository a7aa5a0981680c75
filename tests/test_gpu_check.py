"""scripts/gpu_check.py on a machine without a GPU: the checks the CPU can run run, the
others say plainly that they were skipped and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
GPU_ONLY = ("gpuinfo", "gpu_memory", "out_of_memory")
TIMED = ("fit_speed", "background_save", "compile")  # pass or fail on this machine's speed


def test_without_a_gpu_the_cpu_checks_run_and_the_rest_are_skipped(tmp_path: Path) -> None:
    assert not torch.cuda.is_available()
    out = tmp_path / "gpu check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    results = json.loads(out.read_text())
    checks = results["checks"]
    assert results["device"] == "cpu" and list(checks) == [
        "gpuinfo", "gpu_memory", "fit_speed", "exact_resume", "background_save",
        "out_of_memory", "launch", "compile"], done.stdout + done.stderr
    for name in GPU_ONLY:
        assert checks[name]["status"] == "skipped", checks[name]
        assert checks[name]["why"] == "no CUDA GPU here (torch.cuda.is_available() is False)"
        assert f"{name}: skipped (no CUDA GPU here" in done.stdout
    assert checks["exact_resume"] == {**checks["exact_resume"], "status": "passed",
                                      "different_tensors": []}
    assert checks["launch"]["status"] == "passed"
    assert [rank["backend"] for rank in checks["launch"]["ranks"]] == ["gloo", "gloo"]
    assert checks["fit_speed"]["fp32"]["fit_vs_hand_written_paired"] > 0
    assert checks["background_save"]["state_bytes"] > 0
    assert checks["compile"]["first_step_s"]["cold"] > checks["compile"]["first_step_s"]["warm"]
    for name in TIMED:
        assert checks[name]["status"] in ("passed", "failed") and "error" not in checks[name]
    timed_failures = [name for name in TIMED if checks[name]["status"] == "failed"]
    assert done.returncode == (1 if timed_failures else 0), done.stdout + done.stderr
