"""Processes that end with the process they work for, and keep nothing of it in forks."""

from __future__ import annotations

import os

import pytest
from checkpoint_helpers import in_child
from process_helpers import descriptors_of_a_fork, descriptors_of_this_process

from ipycloud.runtime.lifetime import end_with


def _fork_after_end_with() -> dict[str, list[str]]:
    end_with(os.getppid())
    return {"here": descriptors_of_this_process(), "forked": descriptors_of_a_fork()}


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="watches the parent through a pidfd")
def test_a_process_forked_after_end_with_keeps_no_descriptor_of_the_parent() -> None:
    found = in_child(_fork_after_end_with)
    assert [target for target in found["here"] if "pidfd" in target]  # watched here
    assert not [target for target in found["forked"] if "pidfd" in target]
