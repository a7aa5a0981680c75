"""A training function and its arguments in a file: pickled by value with cloudpickle,
loaded by the worker on every node.

The file holds two pickles: a small header (the Python version and the function's name),
then ``(fn, args, kwargs)``. The code of a function travels as bytecode, which only the
same minor Python version reads, so the loader checks the header first.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ipycloud.runtime.messages import describe_error


class PayloadError(RuntimeError):
    """A payload this interpreter cannot load."""


def python_version() -> str:
    """This interpreter's ``major.minor``."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def dump_payload(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                 by_value: Iterable[ModuleType]) -> bytes:
    """The file's bytes. The code of ``by_value`` modules (those the nodes cannot import)
    is pickled with the function; any other module is named, to be imported there.

    Pickling errors (a lock, an open file, a generator in the closure) propagate.
    """
    import cloudpickle

    header = {"python": python_version(), "function": _name(fn)}
    with _pickled_by_value(cloudpickle, by_value):
        body = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    return pickle.dumps(header) + body


def load_payload(path: str | Path) -> tuple[Callable[..., Any], tuple[Any, ...],
                                             dict[str, Any]]:
    """``(fn, args, kwargs)`` from a payload file; PayloadError if this Python cannot
    read it."""
    with open(path, "rb") as file:
        header = pickle.load(file)
        here = python_version()
        if header.get("python") != here:
            raise PayloadError(f"{path} holds {header.get('function')} pickled by Python "
                               f"{header.get('python')}, which Python {here} cannot load: "
                               f"run it with Python {header.get('python')} (the task's "
                               "setup makes that environment)")
        try:
            fn, args, kwargs = pickle.load(file)
        except Exception as error:
            raise PayloadError(f"cannot load {header.get('function')} from {path}: "
                               f"{describe_error(error)}") from error
    return fn, args, kwargs


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__qualname__)


@contextlib.contextmanager
def _pickled_by_value(cloudpickle: ModuleType, modules: Iterable[ModuleType]) -> Iterator[None]:
    """cloudpickle pickles the code of ``modules`` by value while inside (a setting of the
    whole process, so undone on the way out)."""
    registered = []
    try:
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
            registered.append(module)
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)
