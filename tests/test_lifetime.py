"""Processes that end with the process they work for, and keep nothing of it in forks."""

from __future__ import annotations

import contextlib
import os

import pytest
from checkpoint_helpers import in_child

from ipycloud.runtime.lifetime import end_with


def descriptor_targets() -> list[str]:
    """What each open descriptor of this process refers to."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return targets


def _fork_after_end_with() -> dict[str, list[str]]:
    end_with(os.getppid())
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # as a DataLoader worker forked by a launch rank
        os.write(writer, "\n".join(descriptor_targets()).encode())
        os._exit(0)
    os.close(writer)
    inherited = os.read(reader, 1 << 16).decode().splitlines()
    os.close(reader)
    os.waitpid(child, 0)
    return {"here": descriptor_targets(), "forked": inherited}


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="watches the parent through a pidfd")
def test_a_process_forked_after_end_with_keeps_no_descriptor_of_the_parent() -> None:
    found = in_child(_fork_after_end_with)
    assert [target for target in found["here"] if "pidfd" in target]  # watched here
    assert not [target for target in found["forked"] if "pidfd" in target]
