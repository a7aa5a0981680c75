"""``export``: a training function (or a script) and its cluster, written as a SkyPilot task
that ``sky jobs launch`` runs.

Everything is checked before anything is written: a refusal is one ExportError line and
leaves the folder as it was.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipycloud.runtime._optional import is_available
from ipycloud.runtime.cluster.environment import CHECKPOINT_DIR_VARIABLE
from ipycloud.runtime.cluster.function_file import dump_payload, python_version
from ipycloud.runtime.cluster.imports import function_reach, is_standard, script_imports
from ipycloud.runtime.cluster.options import (
    CHECKPOINT_MOUNT,
    Accelerators,
    ExportError,
    Mount,
    check_bucket,
    check_max_restarts,
    check_name,
    check_nodes,
    check_utf8,
    name_from,
    parse_accelerators,
    parse_data,
)
from ipycloud.runtime.cluster.pins import Installed, Pin, requirements_text
from ipycloud.runtime.cluster.shell_words import shell_word
from ipycloud.runtime.cluster.task import REQUIREMENTS_FILE, TASK_FILE, Plan, task_yaml
from ipycloud.runtime.durable import refuse_a_file, write_bytes_atomically
from ipycloud.runtime.messages import describe_error, one_line
from ipycloud.runtime.units import format_bytes
from ipycloud.runtime.user_warning import warn

PAYLOAD_FILE = "train.pkl"
WORKER_MODULE = "ipycloud.runtime.cluster.worker"
LARGE_PAYLOAD = 10 * 2**20  # more than a function: data it closes over
INSTALL_SKYPILOT = "pip install 'ipycloud[cluster]'"


class ClusterWarning(UserWarning):
    """Something in an export that works, but likely not as meant."""


@dataclass(frozen=True)
class ExportedTask:
    """What ``export`` wrote, and how to launch it. Its text (``str()``, the notebook's
    display) ends with the command that launches it."""

    folder: Path
    training: str  # "train(...)" or the script's name
    files: tuple[str, ...]
    plan: Plan
    pins: tuple[Pin, ...]
    unresolved: tuple[str, ...]  # imported, yet no installed package provides them
    skypilot: str | None  # the SkyPilot version that accepted the task; None: not installed

    @property
    def task_file(self) -> Path:
        return self.folder / TASK_FILE

    @property
    def launch_command(self) -> str:
        return f"sky jobs launch {shell_word(str(self.task_file))}"

    def lines(self) -> list[str]:
        plan = self.plan
        lines = [f"wrote {self.folder}: {', '.join(self.files)}",
                 f"{self.training} on {_machines(plan.nodes, plan.accelerators)}"
                 f"{', spot' if plan.use_spot else ''}; Python {plan.python} on every node; "
                 f"torchrun restarts a failed group up to {plan.max_restarts} times",
                 "pinned: " + ", ".join(_pin_text(pin) for pin in self.pins),
                 f"checkpoints: {plan.bucket} at {CHECKPOINT_MOUNT} (MOUNT_CACHED), named by "
                 f"${CHECKPOINT_DIR_VARIABLE}: use ipycloud.cluster.checkpoint_dir()"]
        if plan.data:
            lines.append("data: " + "; ".join(_mount_text(mount) for mount in plan.data))
        if self.unresolved:
            lines.append("not pinned, as no installed package provides them: "
                         + ", ".join(self.unresolved))
        if self.skypilot is None:
            lines.append(f"SkyPilot is not installed here: {INSTALL_SKYPILOT}, then "
                         f"{self.launch_command}")
        else:
            lines.append(f"SkyPilot {self.skypilot} accepts the task: {self.launch_command}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


@dataclass(frozen=True)
class _Training:
    """What runs on the nodes: files for the task folder, and the program torchrun
    starts."""

    described: str
    files: dict[str, bytes]
    program: tuple[str, ...]
    modules: frozenset[str]
    unresolved: frozenset[str]
    name: str


def export(train: Callable[..., Any] | str | os.PathLike[str], *, folder: str | os.PathLike[str],
           bucket: str, nodes: int = 1, accelerators: str | None = None,
           data: Mapping[str, str | os.PathLike[str]] | None = None,
           args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
           max_restarts: int = 3, use_spot: bool = False,
           name: str | None = None) -> ExportedTask:
    """Write a SkyPilot task that trains ``train`` on a cluster, into ``folder``.

    ``train`` is a function (pickled by value with ``args`` and ``kwargs``, run in every
    process under torchrun by ``run_under_torchrun``) or a script's path (copied; ``args``
    is its command line). ``nodes`` machines, each with ``accelerators`` (``"A100:8"``:
    one process per GPU; None: CPU nodes, one process each). ``bucket`` (``s3://``,
    ``gs://``, ``r2://``, ``https://<account>.blob.core.windows.net/<container>``...) is
    mounted on every node at the folder ``ipycloud.cluster.checkpoint_dir()`` returns there;
    ``data`` maps more mount paths to buckets or to local folders (uploaded). A failed
    process restarts the group up to ``max_restarts`` times; ``use_spot`` asks for spot
    machines. The task is named ``name`` (default: the function's or script's).

    ``folder`` gets ``task.yaml``, ``requirements.txt`` (the versions installed here,
    pinned, for the imports of the training) and the payload or script; it is uploaded
    to every node, so give the task a folder of its own. Where SkyPilot is installed, it
    checks the task first. ExportError (nothing written) for any choice that cannot work.
    """
    plan_name = None if name is None else check_name(name)
    nodes = check_nodes(nodes)
    chosen = parse_accelerators(accelerators)
    bucket = check_bucket(bucket)
    mounts = tuple(parse_data(dict(data) if data is not None else None))
    max_restarts = check_max_restarts(max_restarts)
    target = _target(folder)
    installed = Installed()
    if isinstance(train, str | os.PathLike):
        training = _script(Path(train), args, kwargs, installed)
    else:
        training = _function(train, args, kwargs or {}, installed)
    plan = Plan(name=plan_name or training.name, nodes=nodes, accelerators=chosen,
                use_spot=bool(use_spot), max_restarts=max_restarts, bucket=bucket,
                data=mounts, folder=str(target), python=python_version(),
                program=training.program)
    pinned = installed.pins(training.modules)
    task_text = task_yaml(plan)
    accepted_by = _check_with_skypilot(task_text)
    files = {TASK_FILE: task_text.encode(),
             REQUIREMENTS_FILE: requirements_text(pinned, plan.python).encode(),
             **training.files}
    target.mkdir(parents=True, exist_ok=True)
    for file_name, content in files.items():
        write_bytes_atomically(target / file_name, content)
    return ExportedTask(folder=target, training=training.described, files=tuple(files),
                        plan=plan, pins=tuple(pinned), unresolved=tuple(
                            sorted(training.unresolved)), skypilot=accepted_by)


def _target(folder: str | os.PathLike[str]) -> Path:
    target = Path(folder).expanduser().absolute()
    check_utf8(str(target), "folder")
    try:
        refuse_a_file(target)
    except OSError as error:
        raise ExportError("{folder}: {reason}", folder="folder",
                          reason=one_line(error)) from None
    return target


def _function(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
              installed: Installed) -> _Training:
    if not callable(fn):
        raise ExportError("{train} must be a training function or a script's path, not "
                          "{value}", train="train", value=repr(fn))
    if getattr(fn, "__name__", None) == "<lambda>":
        raise ExportError("{train} is a lambda: define the training function with def",
                          train="train")
    reach = function_reach(fn, [*args, *kwargs.values()], installed.provides)
    shipped = [sys.modules[module] for module in sorted(reach.local)
               if module in sys.modules and module != "__main__"]
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        payload = dump_payload(fn, args, kwargs, shipped)
    except Exception as error:
        raise ExportError("cannot pickle {function} with its arguments ({reason}): make "
                          "such objects inside the function", function=name,
                          reason=describe_error(error)) from None
    if len(payload) > LARGE_PAYLOAD:
        warn(f"{PAYLOAD_FILE} is {format_bytes(len(payload))}: {name} or its "
             "arguments hold data; load it inside the function, or from a bucket "
             "mounted with data=", ClusterWarning)
    return _Training(described=f"{name}(...) from {PAYLOAD_FILE} "
                               f"({format_bytes(len(payload))})",
                     files={PAYLOAD_FILE: payload},
                     program=("-m", WORKER_MODULE, PAYLOAD_FILE),
                     modules=frozenset(reach.modules),
                     unresolved=frozenset(module for module in reach.local
                                          if module not in sys.modules),
                     name=name_from(name))


def _script(path: Path, args: Sequence[Any], kwargs: Mapping[str, Any] | None,
            installed: Installed) -> _Training:
    if kwargs:
        raise ExportError("{kwargs} are for a function: a script takes {args}, its command "
                          "line", kwargs="kwargs", args="args")
    if not path.is_file():
        raise ExportError("no script {path}: give the path of a Python file",
                          path=repr(str(path)))
    check_utf8(path.name, "train")
    if path.name in (TASK_FILE, REQUIREMENTS_FILE, PAYLOAD_FILE):
        raise ExportError("the script's name {path} is the name of a file the task "
                          "writes: rename it", path=repr(path.name))
    command = [_argument(arg) for arg in args]
    content = path.read_bytes()
    try:
        modules = script_imports(content.decode("utf-8"), str(path))
    except (UnicodeDecodeError, SyntaxError) as error:
        raise ExportError("{path} is not a Python script: {reason}", path=repr(str(path)),
                          reason=describe_error(error)) from None
    needed = {module for module in modules if not is_standard(module)}
    return _Training(described=f"script {path.name}", files={path.name: content},
                     program=(_script_word(path.name), *command), modules=frozenset(needed),
                     unresolved=frozenset(module for module in needed
                                          if not installed.provides(module)),
                     name=name_from(path.stem))


def _script_word(name: str) -> str:
    """The script as torchrun's command line names it: ``./-m.py`` for a name that starts
    with a dash, which torchrun would read as its own option."""
    return f"./{name}" if name.startswith("-") else name


def _argument(arg: Any) -> str:
    if isinstance(arg, bool) or not isinstance(arg, str | int | float):
        raise ExportError("{args} of a script are its command line: strings or numbers, "
                          "not {value}", args="args", value=repr(arg))
    return check_utf8(str(arg), "args")


def _check_with_skypilot(task_text: str) -> str | None:
    """The version of SkyPilot that parsed the task; None where none is installed."""
    if not is_available("sky"):
        return None
    with warnings.catch_warnings():  # SkyPilot's own deprecations are not the user's
        warnings.simplefilter("ignore")
        import sky
    try:
        sky.Task.from_yaml_str(task_text)
    except Exception as error:
        raise ExportError("SkyPilot {version} refuses the task: {reason}",
                          version=sky.__version__, reason=one_line(error)) from None
    return str(sky.__version__)


def _machines(nodes: int, accelerators: Accelerators | None) -> str:
    count = "1 node" if nodes == 1 else f"{nodes} nodes"
    return f"{count} x {accelerators}" if accelerators else f"{count} (CPU)"


def _pin_text(pin: Pin) -> str:
    return f"{pin} ({pin.installed} here: local build tag dropped)" if pin.dropped_tag \
        else str(pin)


def _mount_text(mount: Mount) -> str:
    return f"{mount.path} <- {mount.source}{'' if mount.is_bucket else ' (uploaded)'}"
