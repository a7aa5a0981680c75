"""Helpers shared by the checkpoint tests: forked children, bitwise state comparison, and
a callback that acts at given steps of ``fit``."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import torch

from ipycloud.runtime.train.callback import Callback

FORK = multiprocessing.get_context("fork")


class At(Callback):
    """A ``fit`` callback that does something after given steps (a mount dropping out, an
    interrupt)."""

    def __init__(self, actions: dict[int, Callable[[], object]]) -> None:
        self.actions = actions

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        if step in self.actions:
            self.actions[step]()


def in_child(target: Callable[..., Any], *args: Any) -> Any:
    """Run ``target(*args)`` in a forked child and return its result (raise if it failed)."""
    receiver, sender = FORK.Pipe(duplex=False)
    process = FORK.Process(target=_child_main, args=(sender, target, args))
    process.start()
    sender.close()
    try:
        assert receiver.poll(120), "the child sent nothing"
        status, value = receiver.recv()
    finally:
        process.join(30)
    assert status == "ok", value
    return value


def _child_main(sender: Any, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)  # OpenMP's thread pool does not survive fork
    try:
        sender.send(("ok", target(*args)))
    except BaseException as error:  # report everything, the parent asserts
        sender.send(("error", f"{type(error).__name__}: {error}"))


def differences(actual: Any, expected: Any, where: str = "") -> list[str]:
    """Where two nested states differ: tensors bit for bit (and dtype), the rest by ==."""
    if isinstance(expected, torch.Tensor):
        same = (isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype
                and actual.shape == expected.shape and torch.equal(actual, expected))
        return [] if same else [where]
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return [f"{where} keys"]
        return [d for key in expected for d in differences(actual[key], expected[key],
                                                            f"{where}[{key!r}]")]
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            return [f"{where} length"]
        return [d for index, (a, e) in enumerate(zip(actual, expected, strict=True))
                for d in differences(a, e, f"{where}[{index}]")]
    return [] if actual == expected else [f"{where}: {actual!r} != {expected!r}"]
