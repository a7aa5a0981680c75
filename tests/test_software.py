"""torch, XLA and TPU probes: real torch on the CPU, no CUDA initialisation, no torch at all."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ipycloud.runtime.machine.software import _cudnn_text, probe_torch, probe_xla


def test_torch_is_reported_without_initialising_cuda() -> None:
    import torch

    info = probe_torch(nvml_usable=False)
    assert info.version == torch.__version__
    assert info.cuda_runtime == torch.version.cuda
    assert info.cuda_available is False
    assert info.cuda_initialized is False
    assert torch.cuda.is_initialized() is False


def test_without_torch_every_field_is_na(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes torch unimportable
    info = probe_torch(nvml_usable=True)
    assert info.version is None and info.cuda_available is None and info.cudnn is None


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter and return what it printed."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_fresh_process_reports_without_importing_an_uninstalled_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from ipycloud.runtime.machine.report import environment_report\n"
        "text = str(environment_report(processes=True))\n"
        "assert 'not installed' in text.split('torch', 1)[1].splitlines()[0], text\n"
        "print('ok')\n"
    )
    assert run_python(code) == "ok"


def test_a_fresh_process_keeps_cuda_uninitialised() -> None:
    code = (
        "import ipycloud.runtime.machine.report as r; r.environment_report(processes=True)\n"
        "import torch; print(torch.cuda.is_initialized())\n"
    )
    assert run_python(code) == "False"


def test_tpu_signals_are_found_without_importing_torch_xla() -> None:
    info = probe_xla({"PJRT_DEVICE": "TPU", "TPU_ACCELERATOR_TYPE": "v5litepod-8",
                      "TPU_WORKER_ID": "0"})
    assert info.pjrt_device == "TPU"
    assert info.tpu_environment == ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID")
    assert info.tpu_present is True
    assert "torch_xla" not in sys.modules


def test_no_tpu_on_a_plain_machine() -> None:
    info = probe_xla({"PJRT_DEVICE": "CPU"})
    assert info.tpu_present is False and info.tpu_environment == ()


@pytest.mark.parametrize(("code", "text"), [(90100, "9.1.0"), (8902, "8.9.2"), (90501, "9.5.1"),
                                            (None, None)])
def test_cudnn_version_text(code, text) -> None:
    assert _cudnn_text(code) == text
