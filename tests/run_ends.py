"""Every way a run of ``fit`` ends, on every front, with every kind of data: the harness of
``test_run_ends.py`` (a covering subset) and ``benchmarks/run_ends_matrix.py`` (all cells).

A cell is an end x a front x a kind of data. Its run (``run_ends_training.py``) is armed
to end that way at step END_AT; the driver brings the ends that come from outside (an
interrupt, two, SIGTERM, SIGKILL) as a user or a platform would. Then the same cell is
run again, disarmed: the rerun README describes. After each run of a cell:

- every process that called ``fit`` had no live child left once it returned or raised
  (the loaders' workers), and ``fit`` left no descriptor open;
- the process (the kernel's shutdown, the torchrun agents) ended by itself within
  END_LIMIT_S of ``fit``'s end (or of the signal);
- nothing it started is left END_LIMIT_S later (this process is a child subreaper, so
  orphans reach it, those started in new sessions too), and it left no file in /dev/shm
  (a tmpfs of its own there, as root: ``shared_memory_scope``);
- in a kernel that trains once more, ``repeats`` times in all, the kernel holds no more
  processes and descriptors than after the first time.

And of the cell: every line of its run record is strict JSON (no NaN or Infinity), the
run's status is the end's, the newest checkpoint loads, and the rerun resumes (an end
that leaves the run unfinished) or says the run is already complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import run_ends_training as training
import torch
from jupyter_client.manager import KernelManager
from kernels import ready
from local_nodes import LocalNodes
from preloaded_python import PreloadedPython
from process_helpers import ended
from shared_memory_scope import SharedMemoryScope
from soak_processes import reap_zombies, subreaper
from strict_json import loads

from ipycloud.runtime.checkpoint.manager import CheckpointManager
from ipycloud.runtime.runs.reading import runs

ENDS = ("finishes", "early stop", "the model raises", "NaN loss", "NaN metric",
        "one interrupt", "two interrupts", "SIGTERM", "SIGKILL", "sys.exit in a callback",
        "release=True")
FRONTS = ("script", "kernel", "launch(nprocs=2)", "two torchrun agents")
DATA = ("list of batches", "DataLoader, no workers", "2 workers", "persistent workers",
        "ipycloud.loader", "pin_memory", "spawn context")

END_LIMIT_S = 10.0  # a run's processes end within this of fit's end (or of the signal)
HANG_AFTER_S = 20.0  # one that has not ended this long past its limit is taken for a hang
RUN_TIMEOUT_S = 240.0  # a run that has not ended by then hangs
SECOND_INTERRUPT_AFTER_S = 0.05
TRAINING = Path(__file__).with_name("run_ends_training.py")
TESTS = Path(__file__).parent

# The status each end leaves in the run's record (README, "How a run ends": a second
# interrupt stops at once, unsaved, and the record says failed). Under torchrun, Ctrl-C
# reaches the agents, which stop their workers with SIGTERM; SIGKILL kills one rank (the
# out-of-memory killer's way): its agent ends the group, and the first rank, stopped by
# its agent's SIGTERM or failing on the lost peer, says paused or failed.
STATUS = {"finishes": "finished", "early stop": "stopped early", "the model raises": "failed",
          "NaN loss": "failed", "NaN metric": "finished", "one interrupt": "paused",
          "two interrupts": "failed", "SIGTERM": "paused", "SIGKILL": "lost",
          "sys.exit in a callback": "failed", "release=True": "finished"}
TORCHRUN_STATUS = {"one interrupt": ("paused",), "two interrupts": ("paused",),
                   "SIGKILL": ("failed", "paused")}
# Ends after which the run is over: a rerun says it is complete and trains nothing.
COMPLETE = ("finishes", "early stop", "NaN metric", "release=True")
AFTER_THE_END = "after the end"


@dataclass(frozen=True)
class Cell:
    end: str
    front: str
    data: str

    def describe(self) -> str:
        return f"{self.end} / {self.front} / {self.data}"

    def expected_statuses(self) -> tuple[str, ...]:
        if self.front == "two torchrun agents" and self.end in TORCHRUN_STATUS:
            return TORCHRUN_STATUS[self.end]
        return (STATUS[self.end],)


def all_cells() -> list[Cell]:
    """The whole product, front by front."""
    return [Cell(end, front, data) for front in FRONTS for end in ENDS for data in DATA]


@dataclass
class RunResult:
    """One run of a cell (the first, armed; or the rerun)."""

    ended_by_itself: bool = False
    seconds_to_end: float | None = None  # from fit's end (or the signal) to the last exit
    processes_left: list[str] = field(default_factory=list)
    workers_after_fit: list[str] = field(default_factory=list)
    descriptors_left_open: list[str] = field(default_factory=list)
    shared_memory_left: list[str] = field(default_factory=list)
    output: str = ""


@dataclass
class CellResult:
    cell: str
    ended_by_itself: bool = False  # each run of the cell, within the limit
    seconds_to_end: list[float] = field(default_factory=list)
    hangs: int = 0  # runs that had not ended HANG_AFTER_S past the limit
    processes_left: int = 0
    workers_after_fit: int = 0
    descriptors_left_open: int = 0
    shared_memory_left: int = 0
    status: str | None = None  # the record's, after the end
    status_after_rerun: str | None = None
    invalid_records: int = 0
    unloadable_checkpoints: int = 0
    rerun_ok: bool = False
    kernel_repeats: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- one run on each front ---------------------------------------------------------------


class Run:
    """One run of a cell on its front, in ``folder``: started, brought to its end, waited
    for; what it left is measured by ``run_once``."""

    def __init__(self, cell: Cell, folder: Path, armed: bool, environment: dict[str, str],
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.cell, self.folder, self.armed = cell, folder, armed
        self.preexec_fn = preexec_fn  # what its processes are started with
        self.signals = folder / "signals"
        self.environment = environment
        self.output = ""
        self.spec = folder / ("spec-armed.json" if armed else "spec-rerun.json")
        self.spec.write_text(json.dumps({
            "end": cell.end, "front": cell.front, "data": cell.data, "armed": armed,
            "folder": str(folder), "checkpoint": str(folder / "checkpoints")}))

    @property
    def fit_calls(self) -> int:
        """How many processes call ``fit``."""
        return 1 if self.cell.front in ("script", "kernel") else 2

    # The front's part: start, signal, whether it has ended, what it printed, stop it.
    def start(self) -> None:
        raise NotImplementedError

    def deliver(self, end: str, reached_pid: int) -> None:
        raise NotImplementedError

    def running(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        """Kill what is left of it (after a hang)."""
        raise NotImplementedError

    def finish(self) -> float:
        """After ``running`` turned False: end what must be ended (a kernel's shutdown),
        returning when that began (time.time()), or 0.0 when nothing was needed."""
        return 0.0


class ScriptRun(Run):
    """The training as a script, in a session of its own (its group is the terminal's
    foreground group: Ctrl-C reaches the script and what it forked), forked from a
    preloaded interpreter (``preloaded_python``) to spare each run torch's import."""

    interpreter: PreloadedPython  # set by Harness

    def start(self) -> None:
        self.log = self.folder / f"{'first' if self.armed else 'rerun'}.log"
        self.log.touch()
        self.pid = self.interpreter.start([str(TRAINING), str(self.spec)], self.log,
                                          self.environment)
        self.process = psutil.Process(self.pid)

    def deliver(self, end: str, reached_pid: int) -> None:
        _bring(end, self.pid, lambda: os.killpg(self.pid, signal.SIGINT))

    def running(self) -> bool:
        running = not ended(self.process)
        self.output = self.log.read_text(errors="replace")
        return running

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)


class TorchrunRun(Run):
    """Two ``ipycloud torchrun`` agents of one process each (world size 2), never
    restarting the group: an end ends the job. Ctrl-C reaches each agent's group (its
    workers run in sessions of their own); SIGTERM goes to both agents; SIGKILL to the
    rank that is not the first."""

    def start(self) -> None:
        self.nodes = LocalNodes(TRAINING, [str(self.spec)], self.folder / (
            "first-logs" if self.armed else "rerun-logs"), count=2, nproc=1,
            max_restarts=0, environment=self.environment, preexec_fn=self.preexec_fn)
        self.nodes.start()

    def deliver(self, end: str, reached_pid: int) -> None:
        if end == "SIGTERM":
            for node in range(2):
                self.nodes.signal_node(node, signal.SIGTERM)
        elif end == "SIGKILL":
            others = [worker for node in range(2) for worker in self.nodes.workers(node)
                      if worker.pid != reached_pid]
            for worker in others:
                worker.kill()
        else:
            _interrupt(self._press_ctrl_c, end)

    def _press_ctrl_c(self) -> None:
        for agent in self.nodes.agents:
            os.killpg(agent.pid, signal.SIGINT)

    def running(self) -> bool:
        running = any(agent.poll() is None for agent in self.nodes.agents)
        if not running:
            self.output = self.nodes.tail(200)
        return running

    def stop(self) -> None:
        self.nodes.kill()


class KernelRun(Run):
    """The training as a notebook cell of a real kernel; the kernel is shut down once the
    cell is done (unless it ended already), and the rerun is in a fresh kernel."""

    CODE = ("import sys; sys.path.insert(0, {tests!r}); import run_ends_training; "
            "run_ends_training.main({spec!r})")

    def start(self) -> None:
        self.manager = KernelManager(kernel_name="python3")
        log = self.folder / f"kernel-{'first' if self.armed else 'rerun'}.log"
        with open(log, "ab") as stderr:  # what a Jupyter server would log of it
            self.manager.start_kernel(cwd=str(self.folder), env=self.environment,
                                      stderr=stderr, preexec_fn=self.preexec_fn)
        self.pid = self.manager.provisioner.pid  # type: ignore[union-attr]
        self.client_context = ready(self.manager.client())
        self.client = self.client_context.__enter__()
        self.request = self.execute(self.spec)
        self.texts: list[str] = []
        self.idle = False

    def execute(self, spec: Path) -> str:
        return self.client.execute(self.CODE.format(tests=str(TESTS), spec=str(spec)))

    def deliver(self, end: str, reached_pid: int) -> None:
        _bring(end, self.pid, self.manager.interrupt_kernel)

    def running(self) -> bool:
        """Whether the cell still runs (its kernel alive and not idle after it)."""
        if self.idle or ended(psutil.Process(self.pid)):
            return False
        with contextlib.suppress(Exception):  # queue.Empty: nothing yet
            while True:
                message = self.client.get_iopub_msg(timeout=0.1)
                if message["parent_header"].get("msg_id") != self.request:
                    continue
                content, kind = message["content"], message["msg_type"]
                if kind == "stream":
                    self.texts.append(content["text"])
                elif kind == "error":
                    self.texts.append("\n".join(content["traceback"]))
                elif kind == "status" and content["execution_state"] == "idle":
                    self.idle = True
                    break
        self.output = "".join(self.texts)
        return not self.idle

    def train_again(self, times: int) -> dict[str, int]:
        """Train ``times`` more times in this kernel, each into a folder of its own; the
        kernel's live descendants and descriptors after the first time and after them."""
        counts = {"processes_after_first": _live_descendants(self.pid),
                  "descriptors_after_first": psutil.Process(self.pid).num_fds()}
        for time_ in range(times):
            folder = self.folder / f"again-{time_}"
            (folder / "signals").mkdir(parents=True)
            spec = json.loads(self.spec.read_text())
            spec.update(folder=str(folder), checkpoint=str(folder / "checkpoints"),
                        armed=False)
            (folder / "spec.json").write_text(json.dumps(spec))
            self.request, self.idle = self.execute(folder / "spec.json"), False
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while self.running() and time.monotonic() < deadline:
                pass
        counts.update(processes_after_all=_live_descendants(self.pid),
                      descriptors_after_all=psutil.Process(self.pid).num_fds())
        return counts

    def finish(self) -> float:
        if ended(psutil.Process(self.pid)):
            return 0.0
        began = time.time()
        if self.cell.end != "release=True":  # that kernel ends by itself once the cell is
            self.client.shutdown()  # done; else as the notebook's "Shut Down Kernel" asks
        return began

    def kernel_alive(self) -> bool:
        return not ended(psutil.Process(self.pid))

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.client_context.__exit__(None, None, None)
        with contextlib.suppress(Exception):
            self.manager.shutdown_kernel(now=True)
        self.manager.cleanup_resources()


FRONT_RUNS: dict[str, type[Run]] = {"script": ScriptRun, "kernel": KernelRun,
                                    "launch(nprocs=2)": ScriptRun,
                                    "two torchrun agents": TorchrunRun}


def _bring(end: str, pid: int, interrupt: Callable[[], object]) -> None:
    """SIGTERM or SIGKILL to ``pid``; an interrupt (or two) through ``interrupt``."""
    if end in ("SIGTERM", "SIGKILL"):
        os.kill(pid, signal.Signals[end])
    else:
        _interrupt(interrupt, end)


def _interrupt(send: Callable[[], object], end: str) -> None:
    send()
    if end == "two interrupts":
        time.sleep(SECOND_INTERRUPT_AFTER_S)
        send()


def _live_descendants(pid: int) -> int:
    with contextlib.suppress(psutil.Error):
        return sum(not ended(child) for child in psutil.Process(pid).children(recursive=True))
    return 0


def _ours() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _notes(signals: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in signals.glob("after-fit-*.json")]


def run_once(cell: Cell, folder: Path, armed: bool, environment: dict[str, str],
             shared_memory: SharedMemoryScope, repeats: int = 1,
             limit_s: float = END_LIMIT_S) -> tuple[RunResult, dict[str, int]]:
    """Run ``cell`` once in ``folder`` (armed: brought to its end; else the rerun) and
    measure what it left, its processes given ``limit_s`` to end; the kernel's counts
    when ``repeats`` > 1 (a kernel front). ``shared_memory``: the scope (entered) that
    tells the run's files in /dev/shm apart."""
    result, counts = RunResult(), {}
    signals = folder / "signals"
    shutil.rmtree(signals, ignore_errors=True)
    signals.mkdir(parents=True)
    before = _ours()
    with shared_memory.run() as shared_files:
        run = FRONT_RUNS[cell.front](cell, folder, armed, environment,
                                     shared_memory.preexec_fn)
        run.start()
        try:
            end_began = _bring_to_its_end(run, cell, armed, signals)
            if isinstance(run, KernelRun) and repeats > 1 and run.kernel_alive():
                counts = run.train_again(repeats - 1)
            began = run.finish() or end_began
            result.ended_by_itself, result.seconds_to_end = _ended_by_itself(
                run, began, signals, limit_s)
        finally:
            result.output = run.output[-4000:]
            if isinstance(run, KernelRun) or result.ended_by_itself is False:
                run.stop()
        result.processes_left = _left_behind(before, limit_s)
    result.shared_memory_left = shared_files.found
    for note in _notes(signals):
        result.workers_after_fit += note["children"]
        result.descriptors_left_open += note["descriptors_opened"]
    return result, counts


def _bring_to_its_end(run: Run, cell: Cell, armed: bool, signals: Path) -> float:
    """Wait for the run to end, delivering its signal at END_AT; when the signal went."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    signalled_at = 0.0
    due = armed and cell.end in training.SIGNALLED
    reached = signals / "reached"
    while run.running():
        if time.monotonic() > deadline:
            raise RunHang(f"the run did not end in {RUN_TIMEOUT_S:.0f} s:\n{run.output}")
        if due and not signalled_at and reached.exists():
            signalled_at = time.time()
            run.deliver(cell.end, int(reached.read_text()))
            (signals / "go").touch()
        if (not isinstance(run, KernelRun) and len(_notes(signals)) >= run.fit_calls
                and (signalled_at or not due)):
            break  # fit has returned everywhere: the process must end by itself now
        time.sleep(0.02)
    if due and not signalled_at:
        raise RunHang(f"the run ended before step {training.END_AT}:\n{run.output}")
    return signalled_at


def _ended_by_itself(run: Run, began: float, signals: Path, limit_s: float
                     ) -> tuple[bool, float | None]:
    """Whether every process of the run ended within ``limit_s`` of ``began`` (a kernel's
    shutdown, a signal) or of fit's end; the seconds it took (None: more than
    HANG_AFTER_S past ``limit_s``)."""
    fit_ends = [note["t"] for note in _notes(signals)]
    start = max([began, *fit_ends]) if began or fit_ends else time.time()
    while True:
        alive = run.kernel_alive() if isinstance(run, KernelRun) else run.running()
        seconds = time.time() - start
        if not alive:
            return seconds <= limit_s, round(max(0.0, seconds), 2)
        if seconds > limit_s + HANG_AFTER_S:
            return False, None
        time.sleep(0.02)


def _left_behind(before: set[int], limit_s: float) -> list[str]:
    """What the run started and is still running ``limit_s`` after it ended (then killed)."""
    deadline = time.monotonic() + limit_s
    while True:
        left = []
        for process in psutil.Process().children(recursive=True):
            if process.pid not in before and not ended(process):
                with contextlib.suppress(psutil.Error):
                    left.append((process, " ".join(process.cmdline())[:200]))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for process, _ in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    reap_zombies()
    return [f"{process.pid} {command}" for process, command in left]


class RunHang(AssertionError):
    """A run that did not end (or did not reach its end's step)."""


# -- a whole cell --------------------------------------------------------------------------


def environment_for(base: Path) -> dict[str, str]:
    """The runs' environment: this one, with ipycloud's state and config under ``base``."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(base / "state"),
            "XDG_CONFIG_HOME": str(base / "config"),
            "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}


class Harness:
    """Runs cells; a context manager: this process is a child subreaper meanwhile (what a
    run leaves reaches it), and scripts are forked from a preloaded interpreter."""

    def __init__(self, limit_s: float = END_LIMIT_S) -> None:
        self.limit_s = limit_s  # how long a run's processes may take to end

    def __enter__(self) -> Harness:
        self._subreaper = subreaper()
        self._subreaper.__enter__()
        # the preloaded interpreter is started in the runs' namespace: its scripts share it
        self.shared_memory = SharedMemoryScope().__enter__()
        ScriptRun.interpreter = PreloadedPython(environment_for(Path(tempfile.gettempdir())),
                                                self.shared_memory.preexec_fn)
        return self

    def __exit__(self, *exc: object) -> None:
        ScriptRun.interpreter.close()
        self.shared_memory.__exit__(None, None, None)
        self._subreaper.__exit__(None, None, None)

    def run_cell(self, cell: Cell, base: Path, repeats: int = 1) -> CellResult:
        """Run ``cell`` and its rerun in ``base``; never raises for what the cell does.
        ``repeats``: how many times in all a kernel front trains in its first kernel."""
        result = CellResult(cell.describe())
        began = time.monotonic()
        environment = environment_for(base)
        folder, checkpoints = base / "cell", base / "cell" / "checkpoints"
        runs_of_the_cell: list[RunResult] = []
        try:
            folder.mkdir(parents=True)
            first, result.kernel_repeats = run_once(cell, folder, True, environment,
                                                    self.shared_memory, repeats, self.limit_s)
            runs_of_the_cell.append(first)
            summary = _check_record(cell, checkpoints, result, AFTER_THE_END)
            lines = len(strict_lines(checkpoints)[0])
            result.unloadable_checkpoints += _unloadable(checkpoints)
            rerun, _ = run_once(cell, folder, False, environment, self.shared_memory,
                                limit_s=self.limit_s)
            runs_of_the_cell.append(rerun)
            result.rerun_ok = _rerun_did_what_readme_says(cell, checkpoints, summary, lines,
                                                          rerun, result)
            result.unloadable_checkpoints += _unloadable(checkpoints)
        except Exception as error:  # the cell's failure, named; the next cell runs
            result.failures.append("".join(traceback.format_exception_only(error)).strip())
        _gather(result, runs_of_the_cell, self.limit_s)
        result.seconds = round(time.monotonic() - began, 1)
        return result


def _gather(result: CellResult, runs_of_the_cell: list[RunResult], limit_s: float) -> None:
    result.ended_by_itself = len(runs_of_the_cell) == 2 and all(
        run.ended_by_itself for run in runs_of_the_cell)
    for name, run in zip(("the run", "the rerun"), runs_of_the_cell, strict=False):
        if run.seconds_to_end is not None:
            result.seconds_to_end.append(run.seconds_to_end)
        else:
            result.hangs += 1
        if not run.ended_by_itself:
            result.failures.append(f"{name} did not end by itself within {limit_s:.0f} s"
                                   f" of fit's end:\n{run.output[-1500:]}")
        for what, found in (("processes left", run.processes_left),
                            ("loader workers alive after fit", run.workers_after_fit),
                            ("descriptors fit left open", run.descriptors_left_open),
                            ("shared memory left", run.shared_memory_left)):
            if found:
                result.failures.append(f"{name}: {what}: {found}")
        result.processes_left += len(run.processes_left)
        result.workers_after_fit += len(run.workers_after_fit)
        result.descriptors_left_open += len(run.descriptors_left_open)
        result.shared_memory_left += len(run.shared_memory_left)
    repeats = result.kernel_repeats
    if repeats and (repeats["processes_after_all"] > repeats["processes_after_first"]
                    or repeats["descriptors_after_all"] > repeats["descriptors_after_first"]):
        result.failures.append(f"the kernel held more after training again: {repeats}")


def strict_lines(checkpoints: Path) -> tuple[list[dict[str, Any]], int]:
    """The lines of the run records in ``checkpoints`` parsed as strict JSON, and how many
    are not strict JSON (NaN, Infinity, or not JSON at all)."""
    parsed, invalid = [], 0
    for log in sorted((checkpoints / ".ipycloud-runs").glob("*.jsonl")):
        for line in log.read_text(errors="replace").splitlines():
            try:
                parsed.append(loads(line))
            except ValueError:
                invalid += 1
    return parsed, invalid


def _check_record(cell: Cell, checkpoints: Path, result: CellResult, when: str) -> Any:
    """Check the record's lines and status; the run's summary."""
    _, invalid = strict_lines(checkpoints)
    result.invalid_records += invalid
    if invalid:
        result.failures.append(f"{when}: {invalid} record lines are not strict JSON")
    found = runs(checkpoints)
    if len(found) != 1:
        result.failures.append(f"{when}: {len(found)} runs recorded, not 1")
        return None
    if when == AFTER_THE_END:
        result.status = found[0].status
    else:
        result.status_after_rerun = found[0].status
    if found[0].status not in cell.expected_statuses():
        result.failures.append(f"{when}: the record says {found[0].status!r} "
                               f"({found[0].reason}), not {' or '.join(cell.expected_statuses())}")
    return found[0]


def _unloadable(checkpoints: Path) -> int:
    """1 if the newest checkpoint of the folder does not load into the model and
    optimizer (a copy of the folder is loaded, so nothing of the cell changes), else 0."""
    with tempfile.TemporaryDirectory(dir=checkpoints.parent) as copy:
        target = Path(copy) / "checkpoints"
        shutil.copytree(checkpoints, target, ignore=shutil.ignore_patterns(".ipycloud-runs"))
        model = training.Model()
        state = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
        try:
            CheckpointManager(target, fallback=None).load(state, restore_rng=False)
        except Exception:  # what fails to load is counted
            return 1
    return 0


def _rerun_did_what_readme_says(cell: Cell, checkpoints: Path, before: Any, lines: int,
                                rerun: RunResult, result: CellResult) -> bool:
    """A run that is over: the rerun trains nothing (its record gets no line; README:
    "already complete at step N"); else the rerun resumes from a checkpoint and finishes."""
    after = _check_record(Cell(cell.end if cell.end in COMPLETE else "finishes", cell.front,
                               cell.data), checkpoints, result, "after the rerun")
    if after is None or before is None:
        return False
    if cell.end in COMPLETE:
        ok = len(strict_lines(checkpoints)[0]) == lines and after.step == before.step
        what = "train nothing, the run being complete"
    else:
        resumed = [event for event in after.events if event.get("event") == "resume"]
        ok = bool(resumed) and after.step == after.total_steps
        what = "resume and finish"
    if not ok:
        result.failures.append(f"the rerun did not {what} (step {after.step} of "
                               f"{after.total_steps}, events {after.events}):\n"
                               f"{rerun.output[-1500:]}")
    return ok
