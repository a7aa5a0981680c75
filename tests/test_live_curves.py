"""The curves of a run: gathered from fit's rows, smoothed, thinned, redrawn at most once a
second (the clock is the test's), and drawn in History's HTML view."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
import torch
from terminal import terminal_ipython
from torch import nn

from ipycloud.notebook.curves import LiveCurves
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.train import callback
from ipycloud.runtime.train.callback import FINISHED, PAUSED, RunEnd, RunStart
from ipycloud.runtime.train.curves import Line, Smoother, TrainingCurves
from ipycloud.runtime.train.loop import fit

SVG = "{http://www.w3.org/2000/svg}"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Screen:
    def __init__(self) -> None:
        self.shown: list[str] = []

    def show(self, html: str) -> None:
        self.shown.append(html)


def start(total: int | None = 100) -> RunStart:
    return RunStart(folder=None, step=0, epoch=0, total_steps=total, epochs=1, max_steps=None,
                    main=True, curves=True)


def row(step: int, loss: float = 1.0) -> dict[str, Any]:
    return {"step": step, "epoch": 0, "loss": loss, "lr": 0.1, "steps_per_s": 50.0,
            "samples_per_s": 400.0}


def chart_titles(html: str) -> list[str]:
    page = ElementTree.fromstring(f"<div>{html}</div>")
    return [title.text or "" for title in page.iter(f"{SVG}title")]


def test_redraws_at_most_once_a_second_and_always_at_the_end() -> None:
    clock, screen = Clock(), Screen()
    follower = LiveCurves(screen, clock=clock)
    follower.on_start(start())
    follower.on_step(10, row(10))  # the first row is drawn at once
    clock.now += 0.5
    follower.on_step(20, row(20))
    clock.now += 0.49
    follower.on_epoch(0, {"epoch": 0, "steps": 20, "val_loss": 0.5})
    assert len(screen.shown) == 1
    clock.now += 0.01  # a second after the first drawing
    follower.on_step(30, row(30))
    assert len(screen.shown) == 2
    assert "step 30 of 100, epoch 0, 50 steps/s" in screen.shown[-1]
    clock.now += 0.1
    follower.on_end(RunEnd(status=FINISHED, reason=None, step=30, epoch=1))
    assert len(screen.shown) == 3
    assert "finished at step 30, epoch 1" in screen.shown[-1]


def test_a_resumed_run_draws_its_past_rows_too() -> None:
    screen = Screen()
    follower = LiveCurves(screen, clock=Clock())
    past = RunStart(folder=None, step=20, epoch=1, total_steps=40, epochs=2, max_steps=None,
                    main=True, curves=True, past_steps=(row(10, 3.0), row(20, 2.0)),
                    past_epochs=({"epoch": 0, "steps": 20, "val_loss": 2.5},))
    follower.on_start(past)
    follower.on_step(30, row(30, 1.0))

    assert follower.curves.loss.points == [(10, 3.0), (20, 2.0), (30, 1.0)]
    assert follower.curves.metrics["val_loss"].points == [(20, 2.5)]


def test_a_paused_run_draws_its_last_state_with_the_reason() -> None:
    clock, screen = Clock(), Screen()
    follower = LiveCurves(screen, clock=clock)
    follower.on_start(start(total=None))
    follower.on_step(10, row(10))
    follower.on_checkpoint(CheckpointInfo(name="step-12", directory=Path("/tmp/a b"), step=12,
                                          sequence=1, time=0.0, epoch=0))
    follower.on_event("pause", "interrupted at step 12; rerun this cell to continue")
    follower.on_end(RunEnd(status=PAUSED, reason="KeyboardInterrupt: interrupted", step=12,
                          epoch=0))
    assert len(screen.shown) == 2
    assert ("paused at step 12, epoch 0: KeyboardInterrupt: interrupted · checkpoint at "
            "step 12") in screen.shown[-1]
    assert "rerun this cell" not in screen.shown[-1]  # said once, by the end


def test_a_run_that_ends_before_its_first_row_draws_nothing() -> None:
    screen = Screen()
    follower = LiveCurves(screen, clock=Clock())
    follower.on_start(start())
    follower.on_end(RunEnd(status=FINISHED, reason=None, step=3, epoch=0))
    assert screen.shown == []


def test_the_charts_are_the_loss_the_learning_rate_and_each_validation_metric() -> None:
    curves = TrainingCurves()
    curves.add_step(row(10))
    curves.add_epoch({"epoch": 0, "steps": 10, "train_loss": 1.0, "val_loss": 0.9,
                      "val_accuracy": 0.5, "val_f1": 0.4, "seconds": 1.0})
    assert chart_titles(curves.html()) == ["loss", "learning rate", "val_accuracy", "val_f1"]
    legend = ElementTree.fromstring(curves.charts()[0]).find(f"{SVG}g[@class='legend']")
    assert [text.text for text in legend.iter(f"{SVG}text")] == [  # type: ignore[union-attr]
        "loss 1", "smoothed (0.9) 1", "val_loss 0.9"]


def test_the_smoothed_loss_is_the_debiased_moving_average() -> None:
    smoother = Smoother(weight=0.9)
    assert smoother.add(float("nan")) is None
    assert smoother.add(1.0) == pytest.approx(1.0)
    # (0.9 * 0.1 + 0.1 * 0) / (1 - 0.9 ** 2)
    assert smoother.add(0.0) == pytest.approx(0.09 / 0.19)
    assert smoother.add(float("inf")) == pytest.approx(0.09 / 0.19)


def test_a_long_line_keeps_every_other_point_and_the_newest() -> None:
    line = Line(capacity=4)
    for step in range(10):
        line.add(step, float(step))
    assert line.stride == 4
    assert [x for x, _ in line.drawn()] == [0, 4, 8, 9]


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    inputs = torch.randn(64, 4)
    return [(inputs[index:index + 8], inputs[index:index + 8, :2].argmax(1))
            for index in range(0, 64, 8)]


def history_html() -> str:
    model, data = nn.Linear(4, 2), batches()
    history = fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, epochs=2,
                  val_data=data[:2], device="cpu", progress=False, log_every=2)
    return history._repr_html_()


def test_curves_are_asked_for_by_progress_true_only(monkeypatch: pytest.MonkeyPatch) -> None:
    starts: list[RunStart] = []
    monkeypatch.setattr(callback, "_fronts", [])
    callback.register_front(lambda start: starts.append(start))
    for progress in (True, "bar", False):
        model = nn.Linear(4, 2)
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), batches(), device="cpu",
            progress=progress)
    assert [start.curves for start in starts] == [True, False, False]


def test_the_history_html_view_draws_the_curves_above_its_table() -> None:
    html = history_html()
    assert chart_titles(html) == ["loss", "learning rate", "val_accuracy"]
    assert html.index("<svg") < html.index("<table>")
    page = ElementTree.fromstring(f"<div>{html}</div>")
    loss = next(page.iter(f"{SVG}svg")).find(f"{SVG}g[@class='series'][@data-label='loss']")
    assert len(loss.find(f"{SVG}polyline").get("points", "").split()) == 8  # type: ignore[union-attr]


FIT_SCRIPT = """
import torch, ipycloud
from torch import nn
model = nn.Linear(4, 2)
batches = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
ipycloud.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, device="cpu",
             log_every=1)
"""


def test_a_script_shows_the_bar_and_no_curves() -> None:
    result = subprocess.run([sys.executable, "-c", FIT_SCRIPT], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "4/4" in result.stderr
    assert "svg" not in result.stdout + result.stderr
    assert "curves" not in result.stdout + result.stderr


def test_a_terminal_ipython_shows_no_curves() -> None:
    result = terminal_ipython(["%load_ext ipycloud", *FIT_SCRIPT.strip().splitlines(), "",
                               "print('done')"])
    assert "done" in result.stdout, result.stderr
    assert "4/4" in result.stderr
    assert "svg" not in result.stdout and "curves" not in result.stdout
