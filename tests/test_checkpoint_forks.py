"""Nothing of a checkpoint writer leaks into a forked process: a DataLoader worker or any
``os.fork`` child never holds the folder's lock, so no later save waits on it."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipycloud.runtime.durable import LOCK_NAME, folder_lock

WATCHDOG_S = 120


def run_script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, killed by the watchdog if it hangs."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                              capture_output=True, text=True, timeout=WATCHDOG_S)
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"hung for {WATCHDOG_S} s: {hung.stderr!r}") from None




@pytest.fixture
def forked() -> Iterator[list[int]]:
    """The children a test forks, each sleeping until killed at its end."""
    children: list[int] = []
    yield children
    for child in children:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def fork_sleeping(children: list[int]) -> None:
    child = os.fork()
    if child == 0:  # keeps every descriptor it inherited, as a DataLoader worker does
        time.sleep(WATCHDOG_S)
        os._exit(0)
    children.append(child)


def on_the_lock_file(descriptor: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{descriptor}").endswith(LOCK_NAME)
    except OSError:
        return False


def forking_once(call: Callable[..., object], when: Callable[..., bool],
                 children: list[int], after: bool) -> Callable[..., object]:
    """``call``, which forks a sleeping child the first time ``when`` holds for its
    arguments in this process: after the call or before it."""
    parent = os.getpid()

    def forking(*args: object) -> object:
        fork = not children and os.getpid() == parent and when(*args)
        if fork and not after:
            fork_sleeping(children)
        result = call(*args)
        if fork and after:
            fork_sleeping(children)
        return result
    return forking


def test_a_process_forked_while_the_folder_is_locked_does_not_hold_the_lock(
        tmp_path: Path, forked: list[int]) -> None:
    with folder_lock(tmp_path):
        fork_sleeping(forked)
    other = run_script("""
        import sys
        from pathlib import Path
        from ipycloud.runtime.durable import LOCK_NAME, folder_lock
        with folder_lock(Path(sys.argv[1])):
            print("locked")
    """, str(tmp_path))
    assert other.stdout == "locked\n", other.stderr


def test_a_fork_between_opening_the_lock_file_and_recording_it_leaves_no_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forked: list[int]) -> None:
    """Another thread forks (a DataLoader starting its workers) the moment the lock file
    is open: the child must not keep the lock once this process lets it go."""
    monkeypatch.setattr(os, "open", forking_once(
        os.open, lambda path, *_: str(path).endswith(LOCK_NAME), forked, after=True))
    with folder_lock(tmp_path):
        pass
    monkeypatch.undo()
    assert len(forked) == 1
    assert run_script(TRY_LOCK, str(tmp_path / LOCK_NAME)).stdout == "locked\n"


def test_a_fork_between_forgetting_the_lock_file_and_closing_it_leaves_no_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forked: list[int]) -> None:
    with folder_lock(tmp_path):
        monkeypatch.setattr(os, "close", forking_once(
            os.close, on_the_lock_file, forked, after=False))
    monkeypatch.undo()
    assert len(forked) == 1
    assert run_script(TRY_LOCK, str(tmp_path / LOCK_NAME)).stdout == "locked\n"


TRY_LOCK = """
    import fcntl, os, sys
    descriptor = os.open(sys.argv[1], os.O_RDWR)
    try:  # whichever kind of lock the holder takes
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("busy")
    else:
        print("locked")
"""


def test_reading_the_lock_file_in_the_holding_process_keeps_the_lock(tmp_path: Path) -> None:
    """A copy or a sync of the folder in this process opens and closes its lock file: a
    record lock would be released by that close, and another process let in."""
    with folder_lock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_bytes() == b""
        assert run_script(TRY_LOCK, str(tmp_path / LOCK_NAME)).stdout == "busy\n"
    assert run_script(TRY_LOCK, str(tmp_path / LOCK_NAME)).stdout == "locked\n"


def test_a_process_forked_while_a_thread_holds_the_lock_takes_it_once_released(
        tmp_path: Path) -> None:
    """The threads' lock is made afresh in the child: its copy would stay held forever."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with folder_lock(tmp_path):
            held.set()
            release.wait(WATCHDOG_S)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(WATCHDOG_S)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        with folder_lock(tmp_path):
            os.write(writer, b"locked")
        os._exit(0)
    os.close(writer)
    release.set()
    holder.join()
    try:
        assert select.select([reader], [], [], WATCHDOG_S)[0], "the child waits forever"
        assert os.read(reader, 16) == b"locked"
    finally:
        os.close(reader)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_fit_with_workers_forked_each_epoch_and_background_saves_finishes(
        tmp_path: Path) -> None:
    """Workers are forked anew every epoch, often while a background save holds the lock."""
    result = run_script("""
        import sys
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        import ipycloud

        torch.manual_seed(0)
        torch.set_num_threads(1)  # leaves a core free: saves go to the background
        data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=2)
        history = ipycloud.fit(model, optimizer, loader, epochs=4, checkpoint=sys.argv[1],
                               checkpoint_every_steps=3, progress=False)
        print(len(history.epochs), ipycloud.CheckpointManager(sys.argv[1]).latest().step)
    """, str(tmp_path / "checkpoints"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["4", "64"]
