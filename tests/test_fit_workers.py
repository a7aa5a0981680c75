"""The DataLoader workers of ``fit`` end with it, however it ends: a script, a ``launch``
rank or a torchrun worker that trains with ``ipycloud.loader`` exits by itself."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from checkpoint_helpers import FORK
from process_helpers import descriptors_of_this_process, ended
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from ipycloud.runtime.train.callback import Callback, StopTraining
from ipycloud.runtime.train.data import loader
from ipycloud.runtime.train.interrupt import FitInterrupted
from ipycloud.runtime.train.loop import NonFiniteLossError, fit

EXIT_TIMEOUT_S = 240.0  # a script that hangs at exit hangs forever: this only bounds the test

ISSUE_SCRIPT = """\
import torch, ipycloud
ds = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 3, (256,)))
m = torch.nn.Linear(16, 3)
ipycloud.fit(m, torch.optim.AdamW(m.parameters()), ipycloud.loader(ds, batch_size=16), epochs=2,
             loss_fn=torch.nn.functional.cross_entropy, progress=False)
print("returned")
"""

MODEL_RAISES_SCRIPT = """\
import torch, ipycloud

class Breaks(torch.nn.Linear):
    calls = 0
    def forward(self, inputs):
        Breaks.calls += 1
        if Breaks.calls == 5:
            raise RuntimeError("the model broke")
        return super().forward(inputs)

ds = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 3, (256,)))
m = Breaks(16, 3)
ipycloud.fit(m, torch.optim.AdamW(m.parameters()),
             ipycloud.loader(ds, batch_size=16, num_workers=2), epochs=2,
             loss_fn=torch.nn.functional.cross_entropy, progress=False)
"""

RANKS_SCRIPT = """\
import os, psutil, torch, ipycloud

def train():
    ds = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 3, (256,)))
    m = torch.nn.Linear(16, 3)
    ipycloud.fit(m, torch.optim.AdamW(m.parameters()),
                 ipycloud.loader(ds, batch_size=16, num_workers=2), epochs=2,
                 loss_fn=torch.nn.functional.cross_entropy, progress=False)
    return len(psutil.Process().children())

if __name__ == "__main__":
    # one write: torchrun's two ranks share the pipe, and print's pieces interleave
    os.write(1, ("processes left by fit in each rank: " + str({call}) + "\\n").encode())
"""


ABANDONED_SCRIPT = """\
import subprocess, psutil, torch
from ipycloud.runtime.train.data import EpochData, loader

ds = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 3, (256,)))
batches = EpochData(loader(ds, batch_size=16, num_workers=2), seed=0).epoch_batches()
next(batches), next(batches)  # one from each worker: both are past their worker_init_fn
workers = [str(worker.pid) for worker in psutil.Process().children()]
subprocess.run(["kill", "-TERM", *workers], check=True)  # another's: the machine going away
next(batches)
print(len(workers), "workers served on")
"""  # and the script ends with them, the epoch half read

SHARED_MEMORY_SCRIPT = """\
import glob, json, os, signal, time
import psutil, torch, ipycloud
from torch.utils.data import DataLoader, TensorDataset
from ipycloud.runtime.train.callback import Callback
from ipycloud.runtime.train.interrupt import FitInterrupted

torch.multiprocessing.set_sharing_strategy("file_system")
workers = []

def in_shared_memory():
    return sorted(name for pid in workers for name in glob.glob(f"/dev/shm/torch_{{pid}}_*"))

class StopsAtStep3(Callback):
    def on_step(self, step, logs):
        if step != 3:
            return
        workers.extend(child.pid for child in psutil.Process().children())
        deadline = time.monotonic() + 120
        while len(in_shared_memory()) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)  # until batches sent and not yet read are in shared memory
        print("in flight:", len(in_shared_memory()) >= 6)
        os.kill(os.getpid(), signal.SIGINT)  # the Stop button

data = TensorDataset(torch.randn(1024, 16), torch.randint(0, 3, (1024,)))
model = torch.nn.Linear(16, 3)
try:
    ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.1),
                 DataLoader(data, batch_size=8, num_workers=2, prefetch_factor=4,
                            {options}),
                 epochs=1, device="cpu", progress=False, callbacks=[StopsAtStep3()])
except FitInterrupted:
    print("left in shared memory:", json.dumps(in_shared_memory()))
"""  # the workers' files are named after them: /dev/shm/torch_<pid>_...


DESCRIPTORS_SCRIPT = """\
import os, torch, ipycloud
from torch.utils.data import DataLoader, TensorDataset

def descriptors():
    return sorted(int(fd) for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{{fd}}"))  # not the listing's own

class Breaks(torch.nn.Linear):
    calls = 0
    raised_on = None
    def forward(self, inputs):
        Breaks.calls += 1
        if Breaks.calls == 3:
            Breaks.raised_on = inputs
            raise RuntimeError("the model broke")
        return super().forward(inputs).pow(2).mean()

data = DataLoader(TensorDataset(torch.randn(512, 16)), batch_size=8, num_workers=2,
                  {options})
model = Breaks(16, 3)
before = descriptors()
try:
    ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=1,
                 device="cpu", progress=False)
except RuntimeError as error:
    held = error  # with its traceback, as a notebook holds the last one
# the batch the traceback holds stays in shared memory, by one descriptor
batch_descriptor, _size = Breaks.raised_on.untyped_storage()._share_fd_cpu_()
print(held.__traceback__ is not None, descriptors() == sorted([*before, batch_descriptor]))
"""


def run_script(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end; the test fails if it does not exit by itself (it and
    every process it started are killed then)."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"{command} never exited by itself:\n{out}{err[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever it left in its session
            os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def test_the_issues_script_exits_by_itself(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(ISSUE_SCRIPT)
    completed = run_script([sys.executable, "train.py"], tmp_path)
    assert (completed.returncode, completed.stdout) == (0, "returned\n"), completed.stderr


def test_a_script_whose_model_raises_exits_with_the_error(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(MODEL_RAISES_SCRIPT)
    completed = run_script([sys.executable, "train.py"], tmp_path)
    assert completed.returncode == 1
    assert completed.stderr.endswith("RuntimeError: the model broke\n"), completed.stderr


def test_workers_left_running_ignore_others_sigterm_and_end_with_the_script(
        tmp_path: Path) -> None:
    """What fit does not end, multiprocessing's exit handler does: by SIGTERM, which a
    worker takes from its trainer alone."""
    (tmp_path / "train.py").write_text(ABANDONED_SCRIPT)
    completed = run_script([sys.executable, "train.py"], tmp_path)
    assert (completed.returncode, completed.stdout) == (0, "2 workers served on\n"), \
        completed.stderr[-3000:]


SPAWN_SCRIPT = """\
import gc, torch, ipycloud
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":  # a spawned worker imports this file
    data = DataLoader(TensorDataset(torch.randn(64, 16), torch.randint(0, 3, (64,))),
                      batch_size=16, num_workers=1, persistent_workers=True,
                      multiprocessing_context="spawn")
    m = torch.nn.Linear(16, 3)
    ipycloud.fit(m, torch.optim.SGD(m.parameters(), lr=0.1), data, epochs=2,
                 loss_fn=torch.nn.functional.cross_entropy, progress=False)
    del data
    gc.collect()  # the loader's iterator, a reference cycle, and its semaphores go
    print("returned")
"""


def test_a_spawn_loaders_semaphores_are_removed_once_without_a_word(tmp_path: Path) -> None:
    """fit stops the resource tracker it started; had the semaphores still been registered
    with it, it would have removed them saying they leaked, and their own removal, as the
    loader is collected, would have failed."""
    (tmp_path / "train.py").write_text(SPAWN_SCRIPT)
    completed = run_script([sys.executable, "train.py"], tmp_path)
    assert (completed.returncode, completed.stdout) == (0, "returned\n"), completed.stderr
    assert "leaked semaphore" not in completed.stderr
    assert "Exception ignored" not in completed.stderr

SPAWN_KILLED_SCRIPT = """\
import json, os, re, signal, psutil, torch, ipycloud
from torch.utils.data import DataLoader, TensorDataset
from ipycloud.runtime.train.callback import Callback


class KilledAtStep3(Callback):  # as the out-of-memory killer would, mid-run
    def on_step(self, step, logs):
        if step == 3:
            workers = [child.pid for child in psutil.Process().children()
                       if "spawn_main" in " ".join(child.cmdline())]
            mapped = sorted({re.search(r"/dev/shm/sem\\.\\S+", line).group()
                             for pid in workers for line in open(f"/proc/{pid}/maps")
                             if "/dev/shm/sem." in line})  # the names they opened
            print(json.dumps(mapped), flush=True)
            os.killpg(0, signal.SIGKILL)  # the whole group: no tracker is left to clean up


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(256, 16), torch.randint(0, 3, (256,))),
                      batch_size=8, num_workers=2, multiprocessing_context="spawn")
    m = torch.nn.Linear(16, 3)
    ipycloud.fit(m, torch.optim.SGD(m.parameters(), lr=0.1), data, epochs=1,
                 loss_fn=torch.nn.functional.cross_entropy, progress=False,
                 callbacks=[KilledAtStep3()])
"""


def test_a_spawn_loader_killed_mid_run_leaves_no_semaphore_file(tmp_path: Path) -> None:
    """Once its workers have opened them, a loader's semaphores need no file: a run killed
    outright with its whole group, resource tracker and all, leaves none."""
    (tmp_path / "train.py").write_text(SPAWN_KILLED_SCRIPT)
    completed = run_script([sys.executable, "train.py"], tmp_path)
    assert completed.returncode == -signal.SIGKILL, completed.stderr[-3000:]
    mapped = json.loads(completed.stdout)
    assert len(mapped) == 14  # 3 for each worker's index queue, 3 results, 5 done event
    assert [path for path in mapped if os.path.exists(path)] == []


def test_launch_ranks_leave_no_worker_and_the_script_exits_by_itself(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(RANKS_SCRIPT.format(
        call="ipycloud.launch(train, nprocs=2)"))
    completed = run_script([sys.executable, "train.py"], tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout == "processes left by fit in each rank: [0, 0]\n"


def test_torchrun_workers_exit_by_themselves(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(RANKS_SCRIPT.format(
        call="ipycloud.run_under_torchrun(train)"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    completed = run_script([sys.executable, "-m", "torch.distributed.run",
                            "--nproc_per_node=2", f"--master_port={port}", "train.py"],
                           tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.count("processes left by fit in each rank: 0\n") == 2, \
        completed.stdout + completed.stderr[-3000:]


# -- every way fit ends, in a forked child whose processes are its own ----------------------


def in_own_session(target: Callable[..., Any], *args: Any) -> Any:
    """``target(*args)`` in a forked child in a session of its own: its result, once the
    child has exited by itself (the test fails if it does not; it and every process it
    started are killed afterwards)."""
    receiver, sender = FORK.Pipe(duplex=False)
    process = FORK.Process(target=_session_main, args=(sender, target, args))
    process.start()
    sender.close()
    try:
        assert receiver.poll(EXIT_TIMEOUT_S), "the child sent nothing"
        status, value = receiver.recv()
        process.join(EXIT_TIMEOUT_S)
        assert process.exitcode == 0, f"the child did not exit by itself: {value}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.join()
    assert status == "ok", value
    return value


def _session_main(sender: Any, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.setsid()
    torch.set_num_threads(1)  # OpenMP's thread pool does not survive fork
    try:
        sender.send(("ok", target(*args)))
    except BaseException as error:  # report everything, the parent asserts
        sender.send(("error", f"{type(error).__name__}: {error}"))


class Stream(IterableDataset):
    """Each worker streams its share of 64 samples."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        share = range(64)[info.id::info.num_workers] if info is not None else range(64)
        for index in share:
            yield torch.full((4,), float(index)), torch.tensor(index % 2)


def samples(count: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(count, 4, generator=generator),
                         torch.randint(0, 2, (count,), generator=generator))


class Breaks(nn.Linear):
    """Raises, or returns NaN, from its ``after``-th call in training on."""

    def __init__(self, after: int, nan: bool) -> None:
        super().__init__(4, 2)
        self.after, self.nan, self.calls = after, nan, 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        if self.training and self.calls >= self.after:
            if not self.nan:
                raise RuntimeError("the model broke")
            return super().forward(inputs) * float("nan")
        return super().forward(inputs)


class EndsAt(Callback):
    """A callback that ends the run at step 6 (the second epoch's), as ``how`` says."""

    def __init__(self, how: str) -> None:
        self.how = how

    def on_step(self, step: int, logs: dict[str, Any]) -> None:
        if step != 6:
            return
        if self.how == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)
        elif self.how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.how == "sys.exit":
            sys.exit(3)
        elif self.how == "early stop":
            raise StopTraining


ENDINGS: dict[str, type[BaseException] | None] = {
    "finishes": None, "early stop": None, "model raises": RuntimeError,
    "NaN loss": NonFiniteLossError, "interrupt": FitInterrupted,
    "sigterm": KeyboardInterrupt, "sys.exit": SystemExit}

DATA: dict[str, Callable[[], tuple[Any, Any]]] = {
    # rebuilt by fit, workers kept between epochs; the validation loader read as it is
    "ipycloud.loader": lambda: (loader(samples(64), batch_size=16, num_workers=2),
                                loader(samples(32), batch_size=16, shuffle=False,
                                       num_workers=2)),
    # read as it is, workers kept between epochs
    "iterable, persistent workers": lambda: (
        DataLoader(Stream(), batch_size=8, num_workers=2, persistent_workers=True), None)}


def _end_fit(ending: str, data: str) -> dict[str, Any]:
    """Train until ``ending``; what the child holds once fit has returned or raised."""
    signal.signal(signal.SIGTERM, lambda number, frame: None)  # a handler that lets it live
    train, val = DATA[data]()
    workers: set[int] = set()

    class Watch(Callback):
        def on_step(self, step: int, logs: dict[str, Any]) -> None:
            workers.update(child.pid for child in psutil.Process().children())

    model = Breaks(after=7 if data == "ipycloud.loader" else 11,
                   nan=ending == "NaN loss") if "NaN" in ending or "raises" in ending \
        else nn.Linear(4, 2)
    raised: BaseException | None = None
    try:
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), train, val_data=val,
            epochs=3, device="cpu", progress=False, log_every=1,
            callbacks=[Watch(), EndsAt(ending)], seed=0)
    except BaseException as error:  # held, as a notebook holds the last traceback
        raised = error
    held = {"raised": type(raised).__name__ if raised else None,
            "workers seen": len(workers),
            "alive": [child.pid for child in psutil.Process().children()
                      if not ended(child)]}
    raised = None  # its frames hold the batch they trained on, in shared memory
    gc.collect()
    return {**held,
            "shared memory files": [name for name in os.listdir("/dev/shm")
                                    if any(name.startswith(f"torch_{pid}_")
                                           for pid in workers)],
            "shared memory held": [target for target in descriptors_of_this_process()
                                   if target.startswith("/dev/shm/")]}


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("ending", ENDINGS)
def test_no_worker_is_alive_once_fit_has_ended(ending: str, data: str) -> None:
    held = in_own_session(_end_fit, ending, data)
    expected = ENDINGS[ending]
    assert held["raised"] == (expected.__name__ if expected else None)
    assert held["workers seen"] >= 2
    assert held["alive"] == []
    assert held["shared memory files"] == [] and held["shared memory held"] == []


def _fit_twice_on_one_loader() -> list[Any]:
    data = DataLoader(Stream(), batch_size=8, num_workers=2, persistent_workers=True)
    model = nn.Linear(4, 2)
    ends = []
    for _ in range(2):
        history = fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=2,
                      device="cpu", progress=False, log_every=1, seed=0)
        ends.append((history.steps[-1]["step"],
                     [child.pid for child in psutil.Process().children() if not ended(child)]))
    return ends


def test_a_loader_whose_workers_fit_ended_is_read_again_by_the_next_fit() -> None:
    assert in_own_session(_fit_twice_on_one_loader) == [(16, []), (16, [])]


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this system")
@pytest.mark.parametrize("options", ["", "persistent_workers=True", "pin_memory=True"])
def test_a_run_stopped_mid_epoch_leaves_no_batch_in_shared_memory(
        tmp_path: Path, options: str) -> None:
    """Under the "file_system" sharing strategy, a batch sent and never read stays a file
    in /dev/shm until the process exits."""
    (tmp_path / "train.py").write_text(SHARED_MEMORY_SCRIPT.format(options=options))
    completed = run_script([sys.executable, "train.py"], tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.splitlines()[0] == "in flight: True"
    assert completed.stdout.splitlines()[-1] == "left in shared memory: []"


@pytest.mark.parametrize("options", ["", "persistent_workers=True"])
def test_a_failed_fit_leaves_no_descriptor_of_its_loader_open(
        tmp_path: Path, options: str) -> None:
    """The traceback of a failed ``fit`` holds its loader's iterator: the pipes to its
    workers and the batches received ahead of their turn are closed all the same."""
    (tmp_path / "train.py").write_text(DESCRIPTORS_SCRIPT.format(options=options))
    completed = run_script([sys.executable, "train.py"], tmp_path)
    assert (completed.returncode, completed.stdout) == (0, "True True\n"), completed.stderr
