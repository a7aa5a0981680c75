"""Two live writers on one folder keep out of each other's way; a restarted one goes on
with its own run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from kernels import kernel, run
from waiting import wait_for

import ipycloud
from ipycloud.runtime.checkpoint import (
    CheckpointManager,
    CheckpointWarning,
    leases,
)

OTHER_KERNEL = textwrap.dedent("""
    import json, sys, warnings
    import torch
    from ipycloud.runtime.checkpoint import CheckpointManager

    warnings.simplefilter("ignore")
    manager = CheckpointManager(sys.argv[1], keep_last=2)
    for line in sys.stdin:
        command = json.loads(line)
        if command["do"] == "save":
            info = manager.save({"value": torch.tensor(command["value"])}, command["step"])
            print(json.dumps(info.run), flush=True)
        elif command["do"] == "load":
            state = {"value": torch.tensor(0.0)}
            info = manager.load(state)
            print(json.dumps([info.step, float(state["value"])]), flush=True)
""")


class OtherKernel:
    """Another live process that saves into the same folder (keep_last=2)."""

    def __init__(self, folder: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", OTHER_KERNEL, str(folder)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)

    def ask(self, **command: Any) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, f"the other kernel died (exit code {self.process.wait()})"
        return json.loads(answer)

    def kill(self) -> None:
        self.process.kill()
        self.process.communicate()  # and closes the pipes


@pytest.fixture
def other_kernel(tmp_path: Path) -> Iterator[OtherKernel]:
    other = OtherKernel(tmp_path / "shared")
    yield other
    other.kill()


def steps_by_run(folder: Path) -> dict[str | None, list[int]]:
    """The steps of each run in the folder, as the manifests say."""
    found: dict[str | None, list[int]] = {}
    for manifest in sorted(folder.glob("step-*.json")):
        fields = json.loads(manifest.read_text())
        found.setdefault(fields.get("run"), []).append(fields["step"])
    return found


def save_quietly(manager: CheckpointManager, value: float, step: int) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        return manager.save({"value": torch.tensor(value)}, step)


def test_two_live_writers_rotate_only_their_own_and_load_their_own(
        tmp_path: Path, other_kernel: OtherKernel) -> None:
    folder = tmp_path / "shared"
    theirs = other_kernel.ask(do="save", value=1.0, step=1)
    mine = CheckpointManager(folder, keep_last=2)
    with pytest.warns(CheckpointWarning, match=r"another live process \(pid \d+\) saves "):
        mine.save({"value": torch.tensor(2.0)}, 10)
    for step in (2, 3, 4):
        other_kernel.ask(do="save", value=float(step), step=step)
        save_quietly(mine, 10.0 + step, 10 + step)
    ours = leases.claimed(folder)
    assert ours is not None and ours != theirs
    assert steps_by_run(folder) == {theirs: [3, 4], ours: [13, 14]}
    state = {"value": torch.tensor(0.0)}
    assert mine.load(state).step == 14 and float(state["value"]) == 14.0
    assert mine.next_step() == 15
    assert other_kernel.ask(do="load") == [4, 4.0]


def test_a_restarted_writer_goes_on_with_its_own_run(
        tmp_path: Path, other_kernel: OtherKernel) -> None:
    """The other kernel lives on; this one wrote a run, died, and a new process restarts."""
    folder = tmp_path / "shared"
    other_kernel.ask(do="save", value=1.0, step=1)
    first_life = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, warnings
        import torch
        from ipycloud.runtime.checkpoint import CheckpointManager
        warnings.simplefilter("ignore")
        manager = CheckpointManager(sys.argv[1], keep_last=2)
        for step in (100, 101):
            info = manager.save({"value": torch.tensor(float(step))}, step)
        print(info.run)
    """), str(folder)], capture_output=True, text=True, check=True)
    dead_run = first_life.stdout.strip()
    other_kernel.ask(do="save", value=2.0, step=2)  # the newest is the live one's
    restarted = CheckpointManager(folder, keep_last=2)
    state = {"value": torch.tensor(0.0)}
    assert restarted.load(state).step == 101 and float(state["value"]) == 101.0
    with pytest.warns(CheckpointWarning, match="another live process") as warned:
        restarted.save({"value": torch.tensor(102.0)}, 102)
    assert warned[0].filename == __file__
    restarted.save({"value": torch.tensor(103.0)}, 103)
    assert leases.claimed(folder) == dead_run
    assert steps_by_run(folder)[dead_run] == [102, 103]
    assert len(steps_by_run(folder)) == 2


def test_a_fresh_process_continues_the_newest_run_whose_writer_is_gone(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    first = OtherKernel(folder)
    run = first.ask(do="save", value=1.0, step=1)
    first.kill()
    manager = CheckpointManager(folder, keep_last=2)
    manager.save({"value": torch.tensor(2.0)}, 2)
    manager.save({"value": torch.tensor(3.0)}, 3)
    assert steps_by_run(folder) == {run: [2, 3]}  # rotated: one run, keep_last=2


def test_a_writer_that_died_unreaped_is_gone(tmp_path: Path) -> None:
    """A launch rank whose kernel was killed is an orphan, a zombie until init reaps it
    (late, or never in a container without an init)."""
    folder = tmp_path / "run"
    first = OtherKernel(folder)
    run = first.ask(do="save", value=1.0, step=1)
    try:
        first.process.send_signal(signal.SIGKILL)  # and not reaped
        wait_for(lambda: psutil.Process(first.process.pid).status() == psutil.STATUS_ZOMBIE,
                 what="the writer a zombie")
        manager = CheckpointManager(folder, keep_last=2)
        assert manager.live_writers() == {}
        manager.save({"value": torch.tensor(2.0)}, 2)
        assert steps_by_run(folder) == {run: [1, 2]}  # its run goes on
    finally:
        first.kill()


def test_a_process_that_only_reads_loads_the_live_writers_newest(
        tmp_path: Path, other_kernel: OtherKernel) -> None:
    """An evaluation notebook reads the folder a training notebook writes."""
    folder = tmp_path / "shared"
    theirs = other_kernel.ask(do="save", value=1.0, step=1)
    other_kernel.ask(do="save", value=2.0, step=2)
    reader = CheckpointManager(folder)
    state = {"value": torch.tensor(0.0)}
    assert reader.load(state).step == 2 and float(state["value"]) == 2.0
    assert "step-000000002 (latest)" in str(reader.table())
    assert list(reader.live_writers()) == [theirs]
    assert leases.claimed(folder) is None  # its run is not continued here
    save_quietly(reader, 9.0, 9)
    assert leases.claimed(folder) != theirs


def test_fit_starts_afresh_beside_another_live_writers_run(
        tmp_path: Path, other_kernel: OtherKernel, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "shared"
    theirs = other_kernel.ask(do="save", value=5.0, step=7)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(3)]
    with pytest.warns(CheckpointWarning, match="another live process"):
        history = ipycloud.fit(model, optimizer, data, checkpoint=folder)
    assert history.steps[-1]["step"] == 3
    assert "ipycloud.fit: starting afresh: the checkpoints in" in capsys.readouterr().out
    assert steps_by_run(folder)[theirs] == [7]
    assert [step for run, steps in steps_by_run(folder).items() if run != theirs
            for step in steps] == [3]


def test_loading_a_checkpoint_continues_its_run(tmp_path: Path) -> None:
    """Two runs whose writers are gone: loading the older one's checkpoint goes on with it."""
    folder = tmp_path / "run"
    writers = [OtherKernel(folder), OtherKernel(folder)]  # alive together: two runs
    older, newer = (writer.ask(do="save", value=float(step), step=step)
                    for step, writer in enumerate(writers, start=1))
    for writer in writers:
        writer.kill()
    manager = CheckpointManager(folder, keep_last=1)
    manager.load({"value": torch.tensor(0.0)}, which=1)
    manager.save({"value": torch.tensor(3.0)}, 3)
    assert steps_by_run(folder) == {older: [3], newer: [2]}


NOTEBOOK_SETUP = """
%load_ext ipycloud
import torch, warnings
model = torch.nn.Linear(2, 1)
def set_to(value):
    with torch.no_grad():
        model.weight.fill_(value)
"""


def test_two_real_notebooks_on_one_folder(tmp_path: Path) -> None:
    """Two kernels save into one folder with %checkpoint: each restores its own, and
    neither rotates the other's away."""
    shared = tmp_path / "shared runs"
    save = f'%checkpoint save model --dir "{shared}"'
    with kernel(tmp_path) as (_, first), kernel(tmp_path) as (_, second):
        for client in (first, second):
            run(client, NOTEBOOK_SETUP)
        run(first, f"set_to(1.0)\n{save}")
        warned = run(second, f"set_to(2.0)\n{save}")
        assert "another live process" in warned
        for value in (3.0, 4.0, 5.0, 6.0):
            run(first, f"set_to({value})\n{save}")
            run(second, f"set_to({value + 10})\n{save}")
        for client, expected in ((first, "6.0"), (second, "16.0")):
            run(client, f'set_to(0.0)\n%checkpoint restore model --dir "{shared}"')
            assert run(client, "print(model.weight[0, 0].item())").strip() == expected
    assert sorted(len(steps) for steps in steps_by_run(shared).values()) == [3, 3]
