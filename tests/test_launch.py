"""launch(): real forked processes, a real gloo process group, real DDP, real torchrun."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist
from process_helpers import ended
from waiting import wait_for

from ipycloud.runtime.machine import cuda_start
from ipycloud.runtime.train import distributed
from ipycloud.runtime.train.distributed import (
    DistributedInfo,
    LaunchError,
    RemoteTraceback,
    distributed_info,
    is_main_process,
    launch,
    run_under_torchrun,
    wrap_for_distributed,
)

PROMPT_S = 30.0  # far below gloo's 30-minute collective timeout: only a real stop is this fast
REPO = Path(distributed.__file__).resolve().parents[3]


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts os.fork calls (the real fork still runs) to tell whether workers started."""
    calls: list[int] = []
    real_fork = os.fork

    def counting_fork() -> int:
        calls.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", counting_fork)
    return calls


# -- functions the ranks run (module level, as a notebook cell would define them) ----------


def report_environment(base: int, scale: int = 1) -> dict[str, Any]:
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {
        "env": {name: os.environ[name] for name in names},
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "sum": total.item(),
        "value": base * scale + dist.get_rank(),
        "info": distributed_info(),
        "main": is_main_process(),
        "threads": torch.get_num_threads(),
        "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
    }


def global_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 8, generator=generator), torch.randn(16, 3, generator=generator)


def small_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def sgd_steps(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 20) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def train_ddp_on_my_half(seed: int) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = global_batch(seed)
    share = len(x) // world
    model = small_model(seed)
    wrapped = wrap_for_distributed(model, torch.device("cpu"))
    sgd_steps(wrapped, x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share])
    return {"wrapped": type(wrapped).__name__,
            "params": [p.detach().clone() for p in model.parameters()]}


def fail_on_rank_1() -> None:
    if dist.get_rank() == 1:
        raise ValueError("boom")
    dist.barrier()


def rank_0_never_finishes(folder: str) -> None:
    marker = Path(folder, "rank0.pid")
    if dist.get_rank() == 0:
        marker.write_text(str(os.getpid()))
        time.sleep(600)
    deadline = time.monotonic() + PROMPT_S
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError("rank 1 gives up")


def sleep_forever(folder: str) -> None:
    Path(folder, f"{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def rank_1_exits(how: str) -> None:
    if dist.get_rank() == 1:
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def touch(path: str) -> None:
    Path(path).touch()


def return_a_lambda() -> Callable[[], int]:
    return lambda: 1


def single_rank() -> tuple[DistributedInfo | None, bool]:
    model = torch.nn.Linear(2, 2)
    return distributed_info(), wrap_for_distributed(model, "cpu") is model


# -- launching ------------------------------------------------------------------------------


def test_launch_runs_every_rank_with_torchrun_environment_and_returns_in_rank_order() -> None:
    # A handler the kernel might have (keepalive's): a rank must not inherit it.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        results = launch(report_environment, 10, scale=3)
    finally:
        signal.signal(signal.SIGTERM, previous)

    world = min(2, usable_cpus())  # nprocs="auto" without GPUs
    assert len(results) == world
    ports = {result["env"]["MASTER_PORT"] for result in results}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, result in enumerate(results):
        assert result["env"]["RANK"] == result["env"]["LOCAL_RANK"] == str(rank)
        assert result["env"]["WORLD_SIZE"] == result["env"]["LOCAL_WORLD_SIZE"] == str(world)
        assert result["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert (result["rank"], result["world_size"], result["backend"]) == (rank, world, "gloo")
        assert result["sum"] == sum(range(1, world + 1))
        assert result["value"] == 30 + rank
        assert result["info"] == DistributedInfo(rank, world, rank, "gloo")
        assert result["main"] is (rank == 0)
        assert result["threads"] == max(1, usable_cpus() // world)
        assert result["sigterm_default"]


def test_launch_three_ranks_all_reduce() -> None:
    results = launch(report_environment, 0, nprocs=3)
    assert [result["rank"] for result in results] == [0, 1, 2]
    assert [result["sum"] for result in results] == [6.0, 6.0, 6.0]


def test_one_rank_world_leaves_the_model_unwrapped() -> None:
    [(info, unwrapped)] = launch(single_rank, nprocs=1)
    assert info == DistributedInfo(0, 1, 0, "gloo")
    assert unwrapped


def test_ddp_in_two_processes_matches_single_process_training_on_the_global_batch() -> None:
    """Each rank trains on half the global batch; DDP averages the gradients.

    The mean-squared loss over the whole batch has exactly the gradient (g0 + g1) / 2 of the
    two halves' means, so both runs compute the same updates up to float32 rounding: DDP
    divides and sums in another order than one backward over 16 samples. Over 10 seeds the
    largest difference seen was 6e-8 (one float32 ulp for values near 0.5) after 20 steps;
    the tolerance allows 4x that. Training on one half only is off by more than 1e-3.
    """
    seed = 3
    reference = small_model(seed)
    x, y = global_batch(seed)
    sgd_steps(reference, x, y)  # also uses torch in this process before it forks
    rank0, rank1 = launch(train_ddp_on_my_half, seed, nprocs=2)

    assert rank0["wrapped"] == rank1["wrapped"] == "DistributedDataParallel"
    for mine, theirs in zip(rank0["params"], rank1["params"], strict=True):
        assert torch.equal(mine, theirs)  # bitwise identical across ranks
    for mine, expected in zip(rank0["params"], reference.parameters(), strict=True):
        torch.testing.assert_close(mine, expected.detach(), rtol=0, atol=2.5e-7)

    half_only = small_model(seed)
    sgd_steps(half_only, x[:8], y[:8])
    worst = max((a - b).abs().max().item()
                for a, b in zip(rank0["params"], half_only.parameters(), strict=True))
    assert worst > 1e-3  # the comparison above does tell the two apart


# -- failures -------------------------------------------------------------------------------


def test_a_failing_rank_ends_the_launch_with_its_error_and_traceback() -> None:
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        launch(fail_on_rank_1, nprocs=2)
    assert time.monotonic() - started < PROMPT_S
    error = caught.value
    assert str(error) == "rank 1 of 2 failed: ValueError: boom"
    assert error.rank == 1
    assert isinstance(error.__cause__, RemoteTraceback)
    assert 'raise ValueError("boom")' in str(error.__cause__)
    assert error.remote_traceback is not None
    assert error.remote_traceback.rstrip().endswith("ValueError: boom")
    assert "fail_on_rank_1" in error.remote_traceback
    assert multiprocessing.active_children() == []


def test_a_failing_rank_stops_a_peer_that_would_never_finish(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(LaunchError, match="rank 1 of 2 failed: RuntimeError: rank 1 gives up"):
        launch(rank_0_never_finishes, str(tmp_path), nprocs=2)
    assert time.monotonic() - started < PROMPT_S
    peer = int((tmp_path / "rank0.pid").read_text())
    assert not psutil.pid_exists(peer)  # terminated and reaped, not left sleeping


@contextlib.contextmanager
def interrupted(folder: Path, times: int = 1) -> Iterator[list[Path]]:
    """SIGINT to this process (the kernel's interrupt button) once both ranks wrote their
    pid into ``folder``, ``times`` times, 0.5 s apart; the ranks' pid files."""
    pid_files = [folder / "0.pid", folder / "1.pid"]

    def interrupt_once_running() -> None:
        deadline = time.monotonic() + PROMPT_S
        while not all(path.exists() for path in pid_files) and time.monotonic() < deadline:
            time.sleep(0.05)
        for time_ in range(times):
            time.sleep(0.5 if time_ else 0.0)
            os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_once_running)
    interrupter.start()
    try:
        yield pid_files
    finally:
        interrupter.join()


def test_interrupting_the_kernel_stops_every_rank(tmp_path: Path) -> None:
    started = time.monotonic()
    with interrupted(tmp_path) as pid_files, pytest.raises(KeyboardInterrupt):
        launch(sleep_forever, str(tmp_path), nprocs=2)
    assert time.monotonic() - started < PROMPT_S
    for path in pid_files:
        assert not psutil.pid_exists(int(path.read_text()))


def slow_to_stop(folder: str) -> None:
    """A rank that takes a while to end on SIGTERM, as one saving a checkpoint does."""
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(2), os._exit(0)))
    Path(folder, f"{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def test_a_second_interrupt_while_the_ranks_stop_leaves_none_running(tmp_path: Path) -> None:
    # the second comes while the ranks are being stopped: each takes 2 s
    with interrupted(tmp_path, times=2) as pid_files, pytest.raises(KeyboardInterrupt):
        launch(slow_to_stop, str(tmp_path), nprocs=2)
    for path in pid_files:  # reaped before the interrupt went on
        assert not psutil.pid_exists(int(path.read_text()))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

KERNEL_LAUNCHING = """
import os, sys, time
from pathlib import Path
import torch.distributed as dist
from ipycloud.runtime.train.distributed import launch

def sleep_forever(folder):
    Path(folder, f"{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(600)

launch(sleep_forever, sys.argv[1], nprocs=2)
"""


def test_the_ranks_end_with_a_kernel_killed_while_they_run(tmp_path: Path) -> None:
    """A kernel killed by the out-of-memory killer, say: its ranks must not train on and
    write checkpoints beside the next kernel."""
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL_LAUNCHING, str(tmp_path)])
    pid_files = [tmp_path / "0.pid", tmp_path / "1.pid"]
    try:
        wait_for(lambda: all(path.exists() and path.read_text() for path in pid_files),
                 timeout=PROMPT_S, what="both ranks running")
        ranks = [psutil.Process(int(path.read_text())) for path in pid_files]
    finally:
        kernel.kill()
        kernel.wait()
    try:
        wait_for(lambda: all(ended(rank) for rank in ranks), timeout=PROMPT_S,
                 what="the ranks ended with their kernel")
    finally:
        for rank in ranks:
            with contextlib.suppress(psutil.Error):
                rank.kill()


@pytest.mark.parametrize(("how", "expected", "code"), [
    ("exit", "exited with code 3", 3),
    ("kill", "killed by signal SIGKILL", -signal.SIGKILL),
])
def test_a_rank_that_dies_without_reporting_is_named_with_its_exit_status(
    how: str, expected: str, code: int,
) -> None:
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        launch(rank_1_exits, how, nprocs=2)
    assert time.monotonic() - started < PROMPT_S
    assert str(caught.value) == f"rank 1 of 2 died without reporting: {expected}"
    assert (caught.value.rank, caught.value.exitcode) == (1, code)


def test_an_unpicklable_return_value_is_reported() -> None:
    with pytest.raises(LaunchError, match=r"rank 0 of 1 failed: TypeError: the return value "
                                          r"of fn cannot be sent to the notebook"):
        launch(return_a_lambda, nprocs=1)


# -- refusals -------------------------------------------------------------------------------


def cuda_state_seen() -> dict[str, Any]:
    return {"cuda_initialised": torch.cuda.is_initialized(), "rank": dist.get_rank(),
            "threads": torch.get_num_threads()}


def test_after_cuda_is_initialised_the_ranks_start_fresh_and_run(
    monkeypatch: pytest.MonkeyPatch, forks: list[int],
) -> None:
    # No GPU here: torch.cuda.is_initialized() is the one thing that cannot be True, so it
    # is the only part replaced, in this process; a forked rank would inherit the
    # replacement, a fresh one has torch's own (False).
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    results = launch(cuda_state_seen, nprocs=2)
    assert forks == []
    threads = max(1, usable_cpus() // 2)
    assert results == [{"cuda_initialised": False, "rank": rank, "threads": threads}
                       for rank in range(2)]
    results = launch(report_environment, 10, scale=3, nprocs=2)
    assert [result["value"] for result in results] == [30, 31]
    assert [result["sum"] for result in results] == [3.0, 3.0]
    assert all(result["sigterm_default"] for result in results)


def test_what_fresh_ranks_cannot_be_sent_is_refused_naming_where_cuda_began(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda_start, "_started_where", [])
    cuda_start.note_cuda_started("cell In [3] (model = Net().cuda())")
    lock = threading.Lock()

    def holds_a_lock() -> bool:
        return lock.locked()

    with pytest.raises(LaunchError) as caught:
        launch(holds_a_lock, nprocs=2)
    message = str(caught.value)
    assert message.startswith("launch starts its ranks fresh (CUDA is initialised in this "
                              "process, first after cell In [3] (model = Net().cuda())), "
                              "and fn and its arguments cannot be sent to them: ")
    assert "lock" in message and message.endswith(
        "or restart the kernel and call launch() before that cell")
    assert "\n" not in message
    with open(tmp_path / "an open file", "w") as file, pytest.raises(
            LaunchError, match=r"cannot be sent to them: .*before that cell$"):
        launch(touch, file, nprocs=1)


def test_the_fork_counter_does_count_a_launch(forks: list[int], tmp_path: Path) -> None:
    launch(touch, str(tmp_path / "ran"), nprocs=1)
    assert forks == [1] and (tmp_path / "ran").exists()


@pytest.mark.parametrize("nprocs", [0, -1, "many", 2.0, True, None])
def test_refuses_a_bad_process_count(nprocs: Any, forks: list[int]) -> None:
    with pytest.raises(ValueError, match=r"nprocs must be a positive int or 'auto', got "):
        launch(touch, "unused", nprocs=nprocs)
    assert forks == []


def test_refuses_an_unknown_backend(forks: list[int]) -> None:
    with pytest.raises(ValueError, match=r"backend must be 'auto' or one of gloo, nccl, "
                                         r"got 'mpi2'"):
        launch(touch, "unused", backend="mpi2")
    assert forks == []


def test_refuses_nccl_without_a_gpu(forks: list[int]) -> None:
    with pytest.raises(LaunchError, match=r"backend 'nccl' needs NVIDIA GPUs, and none is "
                                          r"usable here .*use backend='gloo'"):
        launch(touch, "unused", backend="nccl", nprocs=1)
    assert forks == []


def test_gpus_that_this_torch_cannot_use_are_not_counted(
    board: Callable[[str], ModuleType], forks: list[int],
) -> None:
    """NVML (a fake board) shows 8 H100s, but the installed torch is a CPU build."""
    assert torch.version.cuda is None
    board("8xH100")
    with pytest.raises(LaunchError, match=r"needs NVIDIA GPUs.*a CPU build"):
        launch(touch, "unused", backend="nccl", nprocs=1)
    assert forks == []
    results = launch(report_environment, 0)  # auto: gloo on the CPU, not 8 NCCL ranks
    assert [result["backend"] for result in results] == ["gloo"] * min(2, usable_cpus())


# -- outside a launch -----------------------------------------------------------------------


def test_helpers_outside_a_process_group() -> None:
    assert not dist.is_initialized()
    model = torch.nn.Linear(2, 2)
    assert distributed_info() is None
    assert is_main_process()
    assert wrap_for_distributed(model, "cpu") is model


def test_run_under_torchrun_refuses_outside_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(LaunchError, match=r"not started by torchrun \(RANK, WORLD_SIZE"):
        run_under_torchrun(touch, "unused")


TORCHRUN_SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist
from ipycloud.runtime.train.distributed import distributed_info, run_under_torchrun

def work(folder, scale):
    info = distributed_info()
    total = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(total)
    return {"info": [info.rank, info.world_size, info.local_rank, info.backend],
            "sum": total.item(), "value": scale * info.rank}

if __name__ == "__main__":
    result = run_under_torchrun(work, sys.argv[1], scale=7)
    result["destroyed"] = not dist.is_initialized()
    with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as out:
        json.dump(result, out)
"""


def test_run_under_torchrun_in_a_real_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         f"--master_port={port}", str(script), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        assert result == {"info": [rank, 2, rank, "gloo"], "sum": 3.0, "value": 7 * rank,
                          "destroyed": True}


def test_importing_the_module_does_not_import_torch() -> None:
    def imports_torch(code: str) -> bool:
        check = f"{code}\nimport sys\nprint('torch' in sys.modules)"
        output = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                                check=True, cwd=REPO).stdout.strip()
        return output == "True"

    assert not imports_torch("import ipycloud.runtime.train.distributed as d\n"
                             "assert d.distributed_info() is None and d.is_main_process()")
    assert imports_torch("import ipycloud.runtime.train.distributed as d\n"
                         "d.launch(int, nprocs=1)")  # the check does see torch arriving
