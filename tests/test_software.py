"""torch, XLA and TPU probes: real torch on the CPU, no CUDA initialisation, no torch at all."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipycloud.runtime.machine.snapshot import take_snapshot
from ipycloud.runtime.machine.software import _cudnn_text, probe_torch, probe_xla
from ipycloud.runtime.machine.torch_files import TorchBuild, cudnn_version, read_torch_build

# torch's version.py as its build writes it (torch 2.5.1 from pip, CUDA 12.1).
CUDA_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']
__version__ = '2.5.1+cu121'
debug = False
cuda: Optional[str] = '12.1'
git_version = 'a8d6afb511a69687bbb2b7e88a3cf67917e1697e'
hip: Optional[str] = None
xpu: Optional[str] = None
"""
CPU_VERSION_PY = CUDA_VERSION_PY.replace("2.5.1+cu121", "2.5.1+cpu").replace("'12.1'", "None")
# The top of cudnn_version.h as the nvidia-cudnn-cu12 9.1.0.70 wheel ships it.
CUDNN_HEADER = """/*
 * Copyright 2014-2023 NVIDIA Corporation.  All rights reserved.
 */

/**
 * \\file: The master cuDNN version file.
 */

#ifndef CUDNN_VERSION_H_
#define CUDNN_VERSION_H_

#define CUDNN_MAJOR 9
#define CUDNN_MINOR 1
#define CUDNN_PATCHLEVEL 0

#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)

#endif /* CUDNN_VERSION_H */
"""
# A torch whose __init__ must not run: the files alone have to tell.
NOT_TO_BE_RUN = "raise RuntimeError('torch/__init__.py was run')\n"


def test_torch_is_reported_without_initialising_cuda() -> None:
    import torch

    info = probe_torch(nvml_gpus=None)
    assert info.version == torch.__version__
    assert info.cuda_runtime == torch.version.cuda
    assert info.cuda_available is False
    assert info.cuda_initialized is False
    assert torch.cuda.is_initialized() is False


def test_without_torch_every_field_is_na(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes torch unimportable
    info = probe_torch(nvml_gpus=1)
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


def torch_modules() -> list[str]:
    return [name for name in sys.modules if name == "torch" or name.startswith("torch.")]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Path]]:
    """A site-packages folder first on sys.path, with torch not imported; ``site(version_py,
    init, cudnn_header)`` writes torch/version.py, torch/__init__.py and nvidia/cudnn."""
    folder = tmp_path / "site-packages"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    for name in torch_modules():
        monkeypatch.delitem(sys.modules, name)

    def install(version_py: str | None, init: str = NOT_TO_BE_RUN,
                cudnn_header: str | None = None) -> Path:
        package = folder / "torch"
        package.mkdir()
        (package / "__init__.py").write_text(init)
        if version_py is not None:
            (package / "version.py").write_text(version_py)
        if cudnn_header is not None:
            include = folder / "nvidia" / "cudnn" / "include"
            include.mkdir(parents=True)
            (include / "cudnn_version.h").write_text(cudnn_header)
        return folder

    yield install
    for name in torch_modules():  # a fake torch imported by the test goes with it
        if str(getattr(sys.modules[name], "__file__", "")).startswith(str(folder)):
            del sys.modules[name]


def test_a_cuda_torch_without_a_gpu_is_read_from_its_files_without_importing_it(site) -> None:
    site(CUDA_VERSION_PY, cudnn_header=CUDNN_HEADER)

    info = probe_torch(nvml_gpus=0)  # CUDA_VISIBLE_DEVICES hides every GPU
    assert (info.version, info.cuda_runtime, info.cudnn) == ("2.5.1+cu121", "12.1", "9.1.0")
    assert (info.cuda_available, info.cuda_initialized, info.mps_available) == (False, False,
                                                                               False)
    assert info.cuda_arches is None
    assert probe_torch(nvml_gpus=None).cuda_available is False  # no NVML, no GPU counted
    assert "torch" not in sys.modules


def test_a_cuda_torch_beside_a_gpu_is_imported_for_its_architectures(site) -> None:
    """Only torch can tell which GPUs it has kernels for (get_arch_list, which does not
    initialise CUDA)."""
    site(CUDA_VERSION_PY, cudnn_header=CUDNN_HEADER, init=IMPORTABLE_TORCH)

    info = probe_torch(nvml_gpus=2)
    assert "torch" in sys.modules
    assert info.cuda_arches == ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
    assert (info.cuda_available, info.cuda_initialized) == (True, False)


def test_a_cpu_torch_is_read_from_its_files_and_needs_no_cudnn(site) -> None:
    site(CPU_VERSION_PY)

    info = probe_torch(nvml_gpus=1)
    assert (info.version, info.cuda_runtime, info.cudnn, info.cuda_available) == (
        "2.5.1+cpu", None, None, False)
    assert "torch" not in sys.modules


def test_the_snapshot_counts_the_gpus_nvml_shows(
        site, board, monkeypatch: pytest.MonkeyPatch) -> None:
    site(CUDA_VERSION_PY, cudnn_header=CUDNN_HEADER, init=IMPORTABLE_TORCH)
    board("no-driver")
    assert take_snapshot().software.torch.cuda_available is False
    assert "torch" not in sys.modules  # no GPU: read from its files
    board("2xA100-MIG")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert take_snapshot().software.torch.cuda_available is False
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert take_snapshot().software.torch.cuda_available is True


# A fake torch/__init__.py that can be imported, with just what the probe asks of torch.
IMPORTABLE_TORCH = """from types import SimpleNamespace
__version__ = "2.5.1+cu121"
version = SimpleNamespace(cuda="12.1")
cuda = SimpleNamespace(device_count=lambda: 1, is_initialized=lambda: False,
                       get_arch_list=lambda: "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90".split())
backends = SimpleNamespace(cudnn=SimpleNamespace(version=lambda: 8902))
"""


@pytest.mark.parametrize(("version_py", "why"), [
    (CUDA_VERSION_PY, "a CUDA build without pip's cuDNN"),
    (None, "no version.py"),
    ("__version__ = get_version()\ncuda = None\n", "a version that is not a literal"),
    ("__version__ = '2.5.1'\n", "no cuda entry"),
    ("__version__ = '2.5.1\n", "a file that does not parse"),
])
def test_torch_is_imported_only_where_its_files_cannot_tell(site, version_py: str | None,
                                                            why: str) -> None:
    site(version_py, init=IMPORTABLE_TORCH)

    info = probe_torch(nvml_gpus=1)
    assert "torch" in sys.modules, why
    assert info.cudnn == "8.9.2" and info.cuda_available is True  # torch's own answers


def test_an_imported_torch_is_asked_rather_than_its_files(site) -> None:
    # Files that say 2.5.1, CUDA 12.1, cuDNN 9.1.0; the module says 2.6.0, 11.8, 8.9.2.
    site(CUDA_VERSION_PY, cudnn_header=CUDNN_HEADER,
         init=IMPORTABLE_TORCH.replace("2.5.1+cu121", "2.6.0+cu118").replace("12.1", "11.8"))
    import torch

    info = probe_torch(nvml_gpus=1)
    assert (info.version, info.cuda_runtime, info.cudnn) == (torch.__version__, "11.8", "8.9.2")
    assert torch.__version__ == "2.6.0+cu118"


@pytest.mark.parametrize(("version_py", "version", "cuda"), [
    (CUDA_VERSION_PY, "2.5.1+cu121", "12.1"),  # annotated, as torch 2 writes it
    ("__version__ = '1.13.1+cu117'\ncuda = '11.7'\n", "1.13.1+cu117", "11.7"),  # plain
])
def test_read_torch_build_takes_plain_and_annotated_assignments(
        site, version_py: str, version: str, cuda: str) -> None:
    site(version_py)
    assert read_torch_build() == TorchBuild(version, cuda)


@pytest.mark.parametrize(("header", "version"), [
    (CUDNN_HEADER, "9.1.0"),
    (CUDNN_HEADER.replace("MAJOR 9", "MAJOR 8").replace("MINOR 1", "MINOR 9").replace(
        "PATCHLEVEL 0", "PATCHLEVEL 7"), "8.9.7"),
    ("#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 10\n", None),  # incomplete: not a version
])
def test_cudnn_version_comes_from_the_header_on_sys_path(site, header: str,
                                                         version: str | None) -> None:
    site(CPU_VERSION_PY, cudnn_header=header)
    assert cudnn_version() == version


def test_without_a_cudnn_folder_there_is_no_cudnn_version(site) -> None:
    site(CPU_VERSION_PY)
    assert cudnn_version() is None


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS torch is imported for MPS")
def test_the_installed_torch_read_from_its_files_matches_torch_itself() -> None:
    code = (
        "import json, sys\n"
        "from ipycloud.runtime.machine.software import probe_torch\n"
        "info = probe_torch(nvml_gpus=None)\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "print(json.dumps({'files': [info.version, info.cuda_runtime],\n"
        "                  'torch': [torch.__version__, torch.version.cuda]}))\n"
    )
    seen = json.loads(run_python(code))
    assert seen["files"] == seen["torch"]


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS torch is imported for MPS")
def test_gpuinfo_in_a_fresh_process_leaves_torch_unimported() -> None:
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_line_magic('load_ext', 'ipycloud')\n"
        "report = shell.run_line_magic('gpuinfo', '')\n"
        "shell.display_formatter.format(report)\n"
        "import importlib.util; assert importlib.util.find_spec('torch') is not None\n"
        "print(report.snapshot.software.torch.version, 'torch' in sys.modules)\n"
    )
    import torch

    assert run_python(code) == f"{torch.__version__} False"
