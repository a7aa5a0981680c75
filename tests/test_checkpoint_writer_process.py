"""Background saves of host-memory states are written by a child process (Linux)."""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from checkpoint_helpers import differences, in_child
from process_helpers import descriptors_of_a_fork, descriptors_of_this_process
from torch import nn
from waiting import wait_for

from ipycloud.runtime.checkpoint import (
    CheckpointError,
    CheckpointManager,
    manager_for,
    writer_process,
)
from ipycloud.runtime.durable import LOCK_NAME, folder_lock
from ipycloud.runtime.per_process import reset_process_state

pytestmark = pytest.mark.skipif(not writer_process.supported(),
                                reason="the writer process needs Linux's memfd_create")


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("PPid:")))


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie no longer does: its parent may be gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def writer_pid(manager: CheckpointManager) -> int:
    assert manager._saves._process is not None and manager._saves._process.pid is not None
    return manager._saves._process.pid


def started_writer(manager: CheckpointManager) -> int:
    """Save step 1 in the background and wait for it; the writer process's PID."""
    manager.save({"weights": torch.ones(8)}, step=1, blocking=False)
    manager.wait()
    return writer_pid(manager)


def steps_and_status(manager: CheckpointManager) -> list[tuple[int, str]]:
    return [(info.step, info.status) for info in manager.list()]


def test_one_child_writes_every_background_save_and_ends_on_close(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep_last=None)
    model = nn.Linear(64, 32)
    manager.save({"model": model}, step=1, blocking=False)
    manager.wait()
    pid = writer_pid(manager)
    assert pid != os.getpid() and parent_of(pid) == os.getpid()
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    manager.save({"model": model}, step=2, blocking=False)
    with torch.no_grad():
        model.weight.fill_(3.0)  # after the copy: the file holds the values at save time
    manager.wait()
    assert writer_pid(manager) == pid
    restored = nn.Linear(64, 32)
    manager.load({"model": restored}, which=2)
    assert differences(restored.state_dict(), expected) == []
    manager.close()
    assert manager._saves._process is None and not alive(pid)
    assert manager.save({"model": model}, step=3, blocking=False) is None  # a new writer
    assert manager.wait().step == 3  # type: ignore[union-attr]
    assert writer_pid(manager) != pid
    manager.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs Linux scheduling policies")
def test_the_writer_writes_at_idle_priority_until_waited_for(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    pid = started_writer(manager)
    assert os.sched_getscheduler(pid) == os.SCHED_OTHER  # waited for: normal priority
    manager.save({"weights": torch.ones(8)}, step=2, blocking=False)
    wait_for(lambda: any(info.step == 2 and info.status == "complete"
                         for info in manager.list()), what="step 2 written unwaited")
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    manager.wait()
    assert os.sched_getscheduler(pid) == os.SCHED_OTHER
    manager.close()


def test_the_writer_ignores_interrupts_meant_for_the_kernel(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    pid = started_writer(manager)
    os.kill(pid, signal.SIGINT)  # what Jupyter's Stop sends to the kernel's process group
    manager.save({"weights": torch.ones(8)}, step=2, blocking=False)
    assert manager.wait().step == 2  # type: ignore[union-attr]
    assert writer_pid(manager) == pid
    manager.close()


def test_a_writer_killed_mid_save_fails_that_save_and_the_next_starts_anew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(tmp_path / "run", keep_last=None)
    pid = started_writer(manager)
    os.kill(pid, signal.SIGSTOP)  # the request waits in its socket, unread
    receive = writer_process.receive_message

    def killed_first(sock: Any) -> Any:
        os.kill(pid, signal.SIGKILL)
        return receive(sock)

    monkeypatch.setattr(writer_process, "receive_message", killed_first)
    manager.save({"weights": torch.full((8,), 2.0)}, step=2, blocking=False)
    with pytest.raises(CheckpointError, match=(
            rf"asynchronous save failed: the checkpoint writer process \(pid {pid}\) was "
            r"killed by signal 9 before step-000000002\.pt was written")):
        manager.wait()
    monkeypatch.undo()
    assert steps_and_status(manager) == [(1, "complete")]
    manager.save({"weights": torch.full((8,), 3.0)}, step=3, blocking=False)
    assert manager.wait().step == 3  # type: ignore[union-attr]
    assert writer_pid(manager) != pid
    assert steps_and_status(manager) == [(1, "complete"), (3, "complete")]
    manager.close()


def test_a_worker_forked_while_the_writer_process_starts_does_not_hold_up_the_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The training thread forks a DataLoader worker (an epoch starts) just as the writer
    process is being started: the worker must not inherit the pipe through which
    subprocess waits for that start, or the save waits for the worker to end."""
    in_fork_exec, worker_forked = threading.Event(), threading.Event()
    name = "_fork_exec" if hasattr(subprocess, "_fork_exec") else "fork_exec"
    module: Any = subprocess if name == "_fork_exec" else subprocess._posixsubprocess  # type: ignore[attr-defined]
    fork_exec = getattr(module, name)

    def fork_exec_while_a_worker_is_forked(*args: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            in_fork_exec.set()
            worker_forked.wait(30)
        return fork_exec(*args)

    monkeypatch.setattr(module, name, fork_exec_while_a_worker_is_forked)
    manager = CheckpointManager(tmp_path / "run")
    manager.save({"weights": torch.ones(8)}, step=1, blocking=False)
    wait_for(lambda: in_fork_exec.is_set() or psutil.Process().children(),
             what="the writer process being started")
    reader, writer = os.pipe()
    worker = os.fork()
    if worker == 0:  # a DataLoader worker: holds what it inherited until its epoch ends
        os.close(writer)
        os.read(reader, 1)
        os._exit(0)
    os.close(reader)
    worker_forked.set()
    waiter = threading.Thread(target=manager.wait, daemon=True)
    try:
        waiter.start()
        waiter.join(30)
        assert not waiter.is_alive(), "the save waits for the worker to end"
    finally:
        os.close(writer)
        os.waitpid(worker, 0)
    assert manager.wait().step == 1  # type: ignore[union-attr]
    manager.close()


def test_a_request_cut_short_ends_the_writer_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    """Its process died while sending a request (the writer may read the cut before it
    sees the death): the writer's output goes to the kernel's log, and it stays clean."""
    process = writer_process.WriterProcess()
    process.stage({"weights": torch.ones(8)})  # starts the child
    child, sock = process._child, process._socket
    assert child is not None and sock is not None
    sock.sendall(writer_process._HEADER.pack(1000) + b"the first bytes")
    sock.shutdown(socket.SHUT_WR)
    assert child.wait(timeout=60) == 0
    assert capfd.readouterr().err == ""
    process.close()


def _write_error_in_the_writer(folder: str) -> dict[str, Any]:
    """The writer starts under a 64 KiB file size cap that this process then lifts."""
    manager = CheckpointManager(folder, keep_last=None)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        manager.save({"weights": torch.ones(8)}, step=1, blocking=False)
        manager.wait()  # the writer now runs under the cap
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    outcome: dict[str, Any] = {"writer": writer_pid(manager)}
    manager.save({"weights": torch.ones(1 << 18)}, step=2, blocking=False)
    try:
        manager.wait()
    except CheckpointError as error:
        outcome["error"] = str(error)
    outcome["listed"] = steps_and_status(manager)
    outcome["leftovers"] = sorted(path.name for path in Path(folder).iterdir()
                                  if path.name.startswith(".tmp-"))
    manager.close()
    return outcome


def test_a_write_error_in_the_writer_reads_as_one_in_this_process(tmp_path: Path) -> None:
    folder = tmp_path / "my ckpts"
    outcome = in_child(_write_error_in_the_writer, str(folder))
    assert outcome["writer"] != os.getpid()
    assert outcome["error"] == (
        f"the previous asynchronous save failed: could not write step-000000002 in {folder}: "
        "File too large; the previous checkpoints are untouched")
    assert outcome["listed"] == [(1, "complete")]
    assert outcome["leftovers"] == []


def test_a_state_that_changes_shape_gets_a_new_region_and_loads_exactly(
        tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run", keep_last=None)
    torch.manual_seed(0)
    small = nn.Linear(4, 4)
    optimizer = torch.optim.Adam(small.parameters())
    small(torch.randn(2, 4)).sum().backward()
    optimizer.step()  # Adam's moments and its 0-d step counters
    odd = {"empty": torch.empty(0, 3), "mask": torch.tensor([True, False, True]),
           "half": torch.randn(5, dtype=torch.bfloat16), "counts": torch.arange(7),
           "strided": torch.arange(12.0).reshape(3, 4).t()}
    first = {"model": small, "optimizer": optimizer, **odd}
    expected_first = {"model": {k: v.clone() for k, v in small.state_dict().items()},
                      **{name: tensor.clone() for name, tensor in odd.items()}}
    manager.save(first, step=1, blocking=False)
    manager.wait()
    assert manager._saves._process is not None
    regions = manager._saves._process._buffers.generation
    manager.save(first, step=2, blocking=False)
    manager.wait()
    assert manager._saves._process._buffers.generation == regions  # same layout, same region
    grown = nn.Linear(8, 3)
    manager.save({"model": grown}, step=3, blocking=False)
    manager.wait()
    assert manager._saves._process._buffers.generation == regions + 1

    restored = {"model": nn.Linear(4, 4), **{name: torch.zeros_like(tensor)
                                             for name, tensor in odd.items()}}
    manager.load(restored, which=1, strict=False)
    assert differences({"model": restored["model"].state_dict(),
                        **{name: restored[name] for name in odd}}, expected_first) == []
    optimizer_state = torch.load(manager.list()[0].data_path,
                                 weights_only=True)["state"]["optimizer"]
    assert differences(optimizer_state, optimizer.state_dict()) == []
    restored_grown = nn.Linear(8, 3)
    manager.load({"model": restored_grown}, which=3)
    assert differences(restored_grown.state_dict(), grown.state_dict()) == []
    manager.close()


def _save_in_a_fork(folder: str) -> dict[str, Any]:
    manager = _FORKED_MANAGER
    manager.save({"weights": torch.full((8,), 5.0)}, step=5, blocking=False)
    info = manager.wait()
    outcome = {"writer": writer_pid(manager), "step": info.step if info else None}
    manager.close()
    return outcome


_FORKED_MANAGER: CheckpointManager


def test_a_forked_process_starts_a_writer_of_its_own(tmp_path: Path) -> None:
    global _FORKED_MANAGER
    manager = _FORKED_MANAGER = CheckpointManager(tmp_path / "run", keep_last=None)
    ours = started_writer(manager)
    outcome = in_child(_save_in_a_fork, str(tmp_path / "run"))
    assert outcome["step"] == 5 and outcome["writer"] != ours
    assert alive(ours)  # the fork's exit left our writer alone
    process = manager._saves._process
    assert process is not None  # the fork staged in memory of its own, not ours:
    assert [view.tolist() for view in process._buffers._views.values()] == [[1.0] * 8]
    manager.save({"weights": torch.ones(8)}, step=6, blocking=False)
    assert manager.wait().step == 6  # type: ignore[union-attr]
    assert writer_pid(manager) == ours
    assert [step for step, _ in steps_and_status(manager)] == [1, 5, 6]
    manager.close()


def test_without_an_interpreter_to_start_the_thread_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no python here"))
    manager = CheckpointManager(tmp_path / "run")
    weights = torch.arange(8.0)
    assert manager.save({"weights": weights}, step=1, blocking=False) is None
    assert manager.wait().step == 1  # type: ignore[union-attr]
    assert manager._saves._process is not None and manager._saves._process.pid is None
    restored = torch.zeros(8)
    manager.load({"weights": restored})
    assert restored.tolist() == weights.tolist()
    manager.close()


def test_forgetting_the_process_state_ends_the_folders_writers(tmp_path: Path) -> None:
    manager = manager_for(tmp_path / "run")
    pid = started_writer(manager)
    reset_process_state()
    assert manager._saves._process is None and not alive(pid)


def test_close_ends_the_writer_while_a_fork_holds_a_copy_of_its_socket(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    started_writer(manager)
    assert manager._saves._process is not None and manager._saves._process._child is not None
    child = manager._saves._process._child
    reader, writer = os.pipe()
    fork = os.fork()
    if fork == 0:  # holds a copy of every descriptor until the pipe closes
        os.close(writer)
        os.read(reader, 1)
        os._exit(0)
    os.close(reader)
    try:
        manager.close()
        assert child.returncode == 0  # it read the end and exited: not killed after a wait
    finally:
        os.close(writer)
        os.waitpid(fork, 0)


KERNEL_SAVING = """
import sys, time
import torch
from ipycloud.runtime.checkpoint import CheckpointManager, writer_process

send_message = writer_process.send_message

def announced(*args):
    send_message(*args)
    print("sent", flush=True)

manager = CheckpointManager(sys.argv[1])
manager.save({"weights": torch.ones(1 << 16)}, step=1, blocking=False)
manager.wait()
print(manager._saves._process.pid, flush=True)
sys.stdin.readline()  # the test stops the writer meanwhile
writer_process.send_message = announced
manager.save({"weights": torch.full((1 << 16,), 2.0)}, step=2, blocking=False)
time.sleep(600)  # killed by the test once the request is sent
"""


def test_a_writer_whose_kernel_died_commits_nothing_over_a_later_checkpoint(
        tmp_path: Path) -> None:
    """A kernel killed during a background save; a new kernel saves the same step; the old
    writer, frozen with its request in hand meanwhile, then gets to run."""
    folder = tmp_path / "run"
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL_SAVING, str(folder)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert kernel.stdin is not None and kernel.stdout is not None
    try:
        writer = int(kernel.stdout.readline())
        os.kill(writer, signal.SIGSTOP)
        kernel.stdin.write("go\n")
        kernel.stdin.flush()
        assert kernel.stdout.readline() == "sent\n"
    finally:
        kernel.kill()
        kernel.wait()
    new_kernel = CheckpointManager(folder)
    saved = new_kernel.save({"weights": torch.full((1 << 16,), 3.0)}, step=2)
    assert saved is not None and saved.name == "step-000000002"
    with contextlib.suppress(ProcessLookupError):
        os.kill(writer, signal.SIGCONT)
    wait_for(lambda: not alive(writer), what="the orphaned writer gone")
    restored = {"weights": torch.zeros(1 << 16)}
    assert new_kernel.load(restored).name == "step-000000002"
    assert torch.equal(restored["weights"], torch.full((1 << 16,), 3.0))
    new_kernel.save({"weights": torch.zeros(1)}, step=3)  # tidies what the dead left
    assert not [path.name for path in folder.iterdir() if path.name.startswith(".tmp-")]


def resources_held() -> dict[str, int]:
    """The regions, descriptors, threads and child processes of checkpoint writers here."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {
        "region descriptors": sum("memfd:ipycloud-checkpoint" in target
                                  for target in descriptors_of_this_process()),
        "mapped regions": sum("memfd:ipycloud-checkpoint" in line for line in maps),
        "writer threads": sum(thread.name == "ipycloud-checkpoint-writer"
                              for thread in threading.enumerate()),
        "writer processes": len(psutil.Process().children()),
    }


def test_managers_dropped_without_close_leave_nothing_behind(tmp_path: Path) -> None:
    """A rerun cell builds a new manager and saves in the background; the old one is
    dropped, never closed."""
    held = []
    for _ in range(6):
        manager = CheckpointManager(tmp_path / "run")
        manager.save({"weights": torch.zeros(1 << 20)}, step=manager.next_step(),
                     blocking=False)
        manager.wait()
        del manager
        gc.collect()
        wait_for(lambda: resources_held()["writer processes"] == 0,
                 what="the dropped manager's writer gone")
        held.append(resources_held())
    assert held == [dict.fromkeys(held[0], 0)] * len(held)


def test_a_forked_process_keeps_no_region_or_lock_descriptor(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    manager = CheckpointManager(folder)
    started_writer(manager)
    with folder_lock(folder):  # as a background save holds it while a worker is forked
        assert any("memfd:ipycloud-checkpoint" in target
                   for target in descriptors_of_this_process())
        inherited = descriptors_of_a_fork()
    assert not [target for target in inherited
                if "memfd:ipycloud" in target or target.endswith(LOCK_NAME)]
    manager.save({"weights": torch.zeros(8)}, step=2, blocking=False)  # the parent's own
    assert manager.wait().step == 2  # type: ignore[union-attr]
