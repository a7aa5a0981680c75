"""The parts of ``fit`` under torchrun that need no cluster: settling DDP's buckets, the
``ipycloud torchrun`` entry point, the checks a torchrun rank gets, and the limit on a
background save's idle priority."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from ipycloud.runtime.checkpoint import CheckpointManager, background_saves
from ipycloud.runtime.checkpoint.background import BackgroundWriter
from ipycloud.runtime.durable import folder_lock
from ipycloud.runtime.train import elastic
from ipycloud.runtime.train.buckets import rebuilds_buckets, settle_buckets
from ipycloud.runtime.train.distributed import LaunchError
from ipycloud.runtime.train.loop import fit


def test_settling_leaves_buffers_generators_and_gradients_as_they_were() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    model.train()
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    batch = torch.randn(16, 4)
    generator_state = torch.get_rng_state()
    settle_buckets(model, lambda: model(batch).sum())
    assert all(torch.equal(buffer, buffers[name]) for name, buffer in model.named_buffers())
    assert torch.equal(torch.get_rng_state(), generator_state)
    assert all(parameter.grad is None for parameter in model.parameters())


def test_only_ddp_over_three_or_more_ranks_is_settled() -> None:
    assert not rebuilds_buckets(nn.Linear(2, 2), world_size=4)  # no DDP, nothing to settle


WORKER = "import os; print('store:', os.environ.get('TORCH_DISABLE_SHARE_RDZV_TCP_STORE'))"


@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("0", "0")])
def test_ipycloud_torchrun_gives_each_group_a_store_unless_told_otherwise(
        tmp_path: Path, given: str | None, seen: str) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    environment = {key: value for key, value in os.environ.items()
                   if key != elastic.SEPARATE_STORES}
    if given is not None:
        environment[elastic.SEPARATE_STORES] = given
    done = subprocess.run([sys.executable, "-m", "ipycloud", "torchrun", "--standalone",
                           "--nproc-per-node=1", str(script)], env=environment,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"store: {seen}" in done.stdout


def test_ipycloud_torchrun_returns_1_when_a_worker_fails(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text("raise SystemExit(3)")
    done = subprocess.run([sys.executable, "-m", "ipycloud", "torchrun", "--standalone",
                           "--nproc-per-node=1", str(script)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "exitcode  : 3" in done.stderr


def test_fit_in_a_torchrun_rank_without_a_process_group_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    model = nn.Linear(2, 1)
    with pytest.raises(LaunchError, match=r"rank 1 of 4 started by torchrun, and no process "
                                          r"group is initialised: call fit inside "
                                          r"ipycloud\.run_under_torchrun"):
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), [torch.zeros(2, 2)])


def test_a_rank_whose_restarts_could_hang_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with pytest.warns(RuntimeWarning, match="start it with 'ipycloud torchrun' instead"):
        elastic.warn_if_restarts_can_hang()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # what ipycloud torchrun gives
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        elastic.warn_if_restarts_can_hang()


def test_a_background_save_gets_normal_priority_without_anyone_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle priority lasts a while only: where training keeps every core busy, an idle
    writer would never run."""
    monkeypatch.setattr(background_saves, "IDLE_PRIORITY_S", 0.5)
    hurried = threading.Event()
    hurry = BackgroundWriter.hurry

    def noting(writer: BackgroundWriter) -> None:
        hurried.set()
        hurry(writer)

    monkeypatch.setattr(BackgroundWriter, "hurry", noting)
    folder = tmp_path / "run"
    manager = CheckpointManager(folder, background="thread")
    manager.save({"weights": torch.zeros(4)}, step=1)
    with folder_lock(folder):  # the writer waits for the folder: the save stays pending
        assert manager.save({"weights": torch.ones(4)}, step=2, blocking=False) is None
        hurried.clear()  # saving waited for the save before it
        assert hurried.wait(timeout=30)  # nobody waits for this one
        assert manager.writing
    assert manager.wait().step == 2  # type: ignore[union-attr]
