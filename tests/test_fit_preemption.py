"""SIGTERM (a machine going away) at any moment of ``fit``: the last finished step is saved,
the process ends by the signal, and the rerun continues bit for bit.

Each run is a fresh interpreter running tests/preempted_training.py, which sends itself a
real SIGTERM at the chosen moment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import differences
from waiting import wait_for

from ipycloud.runtime.train.interrupt import Preemption

SCRIPT = Path(__file__).with_name("preempted_training.py")
TIMEOUT_S = 300


def training(folder: Path, out: Path, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SCRIPT), str(folder), str(out), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = process.communicate(timeout=TIMEOUT_S)
    return process.returncode, out + err


def saved(folder: Path) -> list[tuple[int, int]]:
    """(step, epoch) of each checkpoint in the folder, in the order they were saved."""
    manifests = [json.loads(path.read_text()) for path in folder.glob("step-*.json")]
    return [(manifest["step"], manifest["epoch"])
            for manifest in sorted(manifests, key=lambda manifest: manifest["sequence"])]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The final state of the run never interrupted, on one process and under launch."""
    states = {}
    for name, options in (("one", ()), ("launch", ("--launch",))):
        folder = tmp_path_factory.mktemp(f"whole-{name}")
        code, text = finished(training(folder / "run", folder / "out.pt", *options))
        assert code == 0, text
        states[name] = torch.load(folder / "out.pt")
    return states


@pytest.mark.parametrize(("when", "options", "step", "epoch"), [
    ("first-item", (), 0, 0),
    ("step:7", (), 7, 0),
    ("validation:1", (), 24, 1),  # at once: before the epoch's end, validated again
    ("save:10", (), 10, 0),
    ("workers:1", ("--workers", "2"), 12, 1),  # at once, as the workers start
    ("step:13", ("--workers", "2"), 13, 1),
], ids=["before the first step", "mid-epoch", "during validation", "during a save",
        "while the loader starts its workers", "with workers"])
def test_sigterm_saves_the_last_finished_step_and_the_rerun_continues_exactly(
        tmp_path: Path, uninterrupted: dict[str, dict[str, Any]], when: str,
        options: tuple[str, ...], step: int, epoch: int) -> None:
    folder, out = tmp_path / "run", tmp_path / "out.pt"
    code, text = finished(training(folder, out, "--sigterm", when, *options))
    assert code == -signal.SIGTERM, text
    assert f"ipycloud.fit: saved step {step}; rerun this cell to continue" in text
    assert saved(folder)[-1] == (step, epoch) and not out.exists()
    code, text = finished(training(folder, out, *options))
    assert code == 0, text
    assert differences(torch.load(out), uninterrupted["one"]) == []


@pytest.mark.parametrize("ranks", [(), ("--fresh-ranks",)], ids=["forked", "fresh"])
def test_sigterm_to_a_rank_under_launch_saves_in_the_first(
        tmp_path: Path, uninterrupted: dict[str, dict[str, Any]], ranks: tuple[str, ...]) -> None:
    """Every rank sends itself SIGTERM after step 9: the ranks learn of it at the next
    step boundary (their votes are read a step late), stop there together, the first
    saves and every rank ends by the signal. Ranks started fresh (CUDA up in the
    launching process) end exactly as forked ones."""
    folder, out = tmp_path / "run", tmp_path / "out.pt"
    code, text = finished(training(folder, out, "--launch", *ranks, "--sigterm", "step:9"))
    assert code == 1 and "died without reporting: killed by signal SIGTERM" in text
    assert "ipycloud.fit: saved step 10; rerun this cell to continue" in text
    assert saved(folder)[-1] == (10, 1)  # 6 steps an epoch on two ranks
    code, text = finished(training(folder, out, "--launch", *ranks))
    assert code == 0, text
    assert differences(torch.load(out), uninterrupted["launch"]) == []


def test_an_interrupt_to_one_rank_under_launch_pauses_every_rank_at_one_step(
        tmp_path: Path, uninterrupted: dict[str, dict[str, Any]]) -> None:
    """Ctrl-C reaches the ranks one by one (torchrun's agents pass it on, each to its
    worker): here only the second rank gets it, after step 9. The ranks agree a step
    late, every one pauses at step 10, the first saves it, and the rerun ends exactly as
    the run never interrupted."""
    folder, out = tmp_path / "run", tmp_path / "out.pt"
    code, text = finished(training(folder, out, "--launch", "--sigterm", "interrupt:9"))
    assert code == 1 and "FitInterrupted" in text, text
    assert text.splitlines().count(
        "ipycloud.fit: interrupted at step 10; rerun this cell to continue") == 2, text
    assert saved(folder)[-1] == (10, 1)
    code, text = finished(training(folder, out, "--launch"))
    assert code == 0, text
    assert differences(torch.load(out), uninterrupted["launch"]) == []


@pytest.mark.parametrize("ranks", [(), ("--fresh-ranks",)], ids=["forked", "fresh"])
def test_sigterm_to_the_launching_process_reaches_the_ranks(
        tmp_path: Path, uninterrupted: dict[str, dict[str, Any]], ranks: tuple[str, ...]) -> None:
    folder, out = tmp_path / "run", tmp_path / "out.pt"
    launcher = training(folder, out, "--launch", *ranks)
    wait_for(lambda: saved(folder), timeout=TIMEOUT_S, what="a first checkpoint")
    launcher.send_signal(signal.SIGTERM)
    code, text = finished(launcher)
    assert code == -signal.SIGTERM, text
    assert "ipycloud.fit: saved step" in text
    code, text = finished(training(folder, out, "--launch", *ranks))
    assert code == 0, text
    assert differences(torch.load(out), uninterrupted["launch"]) == []


def test_a_process_forked_while_fit_awaits_sigterm_never_saves() -> None:
    """A DataLoader worker is forked with fit's SIGTERM handler, until its worker_init_fn
    sets SIGTERM aside; a signal in that window must not save from the worker (whose
    save waited on the folder's lock against the trainer's own, and hung both)."""
    saves: list[int] = []
    reader, writer = os.pipe()
    with Preemption(lambda: saves.append(os.getpid()) is None):
        child = os.fork()
        if child == 0:
            os.close(reader)
            signal.raise_signal(signal.SIGTERM)
            os.write(writer, b"saved" if saves else b"went on")
            os._exit(0)
    os.close(writer)
    try:
        assert os.read(reader, 16) == b"went on"
    finally:
        os.close(reader)
        os.waitpid(child, 0)
    assert saves == []


def test_generator_states_are_kept_for_a_sigterm_only_where_the_run_can_save(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each epoch begins by keeping the random generators' states for a SIGTERM's save;
    a run without a checkpoint folder saves nothing, so it keeps none."""
    from torch import nn

    from ipycloud.runtime.checkpoint import rng
    from ipycloud.runtime.train.loop import fit

    captured: list[int] = []
    capture = rng.capture_rng_states
    monkeypatch.setattr(rng, "capture_rng_states",
                        lambda: captured.append(1) or capture())
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]

    def run(**checkpoint: Any) -> int:
        captured.clear()
        model = nn.Linear(3, 2)
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=2,
            progress=False, **checkpoint)
        return len(captured)

    assert run() == 0
    assert run(checkpoint=tmp_path / "checkpoints") >= 3  # the start, then each epoch's
