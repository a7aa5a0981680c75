"""What the installed torch cannot do on the GPU here, said before training fails: a torch
build's architecture list and CUDA version (replaced at torch's boundary, modelled on
PyTorch's wheels) against GPUs and drivers from fake NVML boards modelled on real ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from ipycloud.runtime.machine.build_support import compile_problem, has_kernels_for
from ipycloud.runtime.machine.report import environment_report
from ipycloud.runtime.train.device import choose_device, usable_gpus
from ipycloud.runtime.train.loop import fit

# The architectures of PyTorch's wheels, as torch.cuda.get_arch_list() reports them.
CU126 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU128 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
P100_UNDER_CU128 = (
    "this torch 2.8.0+cu128 has no kernels for the Tesla P100-PCIE-16GB (sm_60): it was "
    "built for sm_75 to sm_120; install a torch built with sm_60 kernels (PyTorch's CUDA "
    "12.6 wheels: pip install torch --index-url https://download.pytorch.org/whl/cu126), or "
    "pick a newer GPU (a T4 or an L4)")


@pytest.fixture
def torch_build(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str, list[str]], None]:
    """Make the installed (CPU) torch say it is another build: version, CUDA, arches."""

    def install(version: str, cuda: str, arches: list[str]) -> None:
        monkeypatch.setattr(torch, "__version__", version)
        monkeypatch.setattr(torch.version, "cuda", cuda)
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arches))

    return install


@pytest.mark.parametrize(("arches", "capability", "runs"), [
    (CU126, (6, 0), True),  # P100
    (CU126, (7, 5), True),  # T4
    (CU126, (8, 9), True),  # L4: sm_86 code runs on 8.9
    (CU126, (12, 0), False),  # RTX 5090: newer than any
    (CU128, (6, 0), False),  # P100: older than any
    (CU128, (7, 0), False),  # V100: sm_75 code does not run on 7.0
    (CU128, (7, 5), True),
    (CU128, (12, 0), True),
    (["sm_80", "compute_80"], (9, 0), True),  # PTX, compiled by the driver for newer GPUs
    (["sm_80", "compute_80"], (7, 5), False),  # but never for older ones
    (["sm_90a"], (9, 0), True),
    ([], (8, 0), False),
])
def test_which_builds_have_kernels_for_which_gpus(arches: list[str],
                                                 capability: tuple[int, int],
                                                 runs: bool) -> None:
    assert has_kernels_for(arches, capability) is runs


def test_gpuinfo_names_a_p100_under_a_build_without_its_kernels(
        board: Callable[[str], ModuleType], torch_build: Callable[..., None],
        shell: InteractiveShell) -> None:
    board("1xP100")
    torch_build("2.8.0+cu128", "12.8", CU128)
    report = environment_report()
    assert report.snapshot.build_problems == (P100_UNDER_CU128,)
    assert f"Warning: {P100_UNDER_CU128}" in str(report).splitlines()
    assert "class='ipycloud-warning'" in report._repr_html_()
    assert report.to_dict()["build_problems"] == [P100_UNDER_CU128]
    shown = shell.run_cell("%gpuinfo", store_history=True)
    assert shown.success
    torch_build("2.6.0+cu126", "12.6", CU126)
    assert environment_report().snapshot.build_problems == ()


def test_a_driver_older_than_the_builds_cuda_is_named(
        board: Callable[[str], ModuleType], torch_build: Callable[..., None]) -> None:
    board("no-power-clocks")  # a Quadro P1000 (6.1) under driver 470, CUDA 11.4
    torch_build("2.8.0+cu128", "12.8", CU126)
    assert environment_report().snapshot.build_problems == (
        "this torch 2.8.0+cu128 is built for CUDA 12.8 and the NVIDIA driver here supports "
        "CUDA 11.4 at most: install a torch built for CUDA 11.4 or older "
        "(https://pytorch.org/get-started/previous-versions/), or update the driver",)


def test_fit_says_the_mismatch_in_its_first_line_and_trains_on_the_cpu(
        board: Callable[[str], ModuleType], torch_build: Callable[..., None],
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    board("1xP100")
    torch_build("2.8.0+cu128", "12.8", CU128)
    assert usable_gpus() == ()
    assert choose_device().reason == P100_UNDER_CU128
    model = torch.nn.Linear(4, 2)
    batches = [(torch.randn(2, 4), torch.tensor([0, 1]))] * 3
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, epochs=1,
        progress=True, precision="fp32")
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"ipycloud.fit: starting on cpu ({P100_UNDER_CU128})"), first
    with pytest.raises(ValueError) as caught:
        choose_device("cuda")
    assert str(caught.value) == f"device='cuda': {P100_UNDER_CU128}"


def test_a_gpu_the_build_runs_is_used(board: Callable[[str], ModuleType],
                                     torch_build: Callable[..., None]) -> None:
    board("1xT4")
    torch_build("2.8.0+cu128", "12.8", CU128)
    assert [gpu.name for gpu in usable_gpus()] == ["Tesla T4"]
    assert choose_device().kind == "cuda"
    assert environment_report().snapshot.build_problems == ()


def test_compile_is_refused_below_compute_capability_7() -> None:
    assert compile_problem("Tesla P100-PCIE-16GB", (6, 0)) == (
        "compile needs a GPU of compute capability 7.0 or newer (Triton) and the Tesla "
        "P100-PCIE-16GB is 6.0: leave compile off")
    assert compile_problem("Tesla T4", (7, 5)) is None
