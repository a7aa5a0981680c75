"""The harness's scope of a run's files in /dev/shm (``shared_memory_scope``): a run's
files are found, another process's are not, and the harness's own process and threads
never leave the machine's mount namespace."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from shared_memory_scope import SHM, SharedMemoryScope

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")


def _write_in_shm(name: str, scope: SharedMemoryScope) -> None:
    code = f"open('{SHM}/{name}', 'w').write('x')"
    subprocess.run([sys.executable, "-c", code], preexec_fn=scope.preexec_fn, check=True)


@as_root
def test_a_runs_file_is_found_and_another_processes_file_is_not() -> None:
    theirs = Path(SHM) / f"theirs-{uuid.uuid4().hex}"
    with SharedMemoryScope() as scope:
        assert scope.private
        with scope.run() as files:
            _write_in_shm("ours", scope)
            theirs.write_text("x")  # this process is not the run's: the machine's /dev/shm
        assert files.found == ["ours"]
        with scope.run() as files:
            pass
        assert files.found == []  # each run has a fresh /dev/shm
    assert theirs.exists() and not (Path(SHM) / "ours").exists()
    theirs.unlink()


@as_root
def test_threads_started_in_the_scope_stay_in_the_machines_namespace() -> None:
    machine = os.readlink("/proc/self/ns/mnt")
    seen: list[str] = []

    def look() -> None:
        seen.append(os.readlink(f"/proc/self/task/{threading.get_native_id()}/ns/mnt"))

    with SharedMemoryScope() as scope, scope.run():
        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
    assert seen == [machine] and os.readlink("/proc/self/ns/mnt") == machine


def test_without_a_namespace_only_files_nobody_holds_are_the_runs() -> None:
    scope = SharedMemoryScope()  # not entered: the machine's /dev/shm, as without root
    held = Path(SHM) / f"held-{uuid.uuid4().hex}"
    left = f"left-{uuid.uuid4().hex}"
    with open(held, "w"), scope.run() as files:
        _write_in_shm(left, scope)
    try:
        assert left in files.found and held.name not in files.found
    finally:
        (Path(SHM) / left).unlink()
        held.unlink()
