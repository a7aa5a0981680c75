"""A validation metric that is NaN or infinite (an R² or F1 on a degenerate batch) never
ends a run: each epoch's checkpoint is written, the value counts neither as the best for
``keep_best`` nor as an improvement for ``EarlyStopping`` (fit says so once), and the
checkpoint manifests and the run's record stay strict JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from strict_json import loads
from test_fit_callbacks import problem

import ipycloud
from ipycloud.runtime.runs.records import RECORD_FOLDER
from ipycloud.runtime.train.early_stopping import EarlyStopping
from ipycloud.runtime.train.history import History

NAN, INF = float("nan"), float("inf")


def metric_of(values: list[float]) -> Any:
    """A metric that gives ``values`` in turn, one an epoch."""
    given: Iterator[float] = iter(values)
    return lambda predictions, labels: next(given)


def train(values: list[float], folder: Path | None = None, **options: Any) -> History:
    model, optimizer, data = problem(32)
    return ipycloud.fit(model, optimizer, data, epochs=len(values), val_data=data,
                        metrics={"r2": metric_of(values)}, device="cpu", progress=False,
                        checkpoint=folder, **options)


def records(folder: Path) -> list[dict[str, Any]]:
    (log,) = (folder / RECORD_FOLDER).glob("*.jsonl")
    return [loads(line) for line in log.read_text().splitlines()]


def test_a_nan_metric_leaves_the_run_going_and_every_epoch_checkpointed(
        tmp_path: Path) -> None:
    folder = tmp_path / "run"
    manager = ipycloud.CheckpointManager(folder, keep_last=None, keep_best=("val_r2", "max"))

    with pytest.warns(RuntimeWarning) as warned:
        history = train([NAN, NAN, NAN], manager)

    assert [math.isnan(logs["val_r2"]) for logs in history.epochs] == [True] * 3
    saved = manager.list()
    assert [info.epoch for info in saved] == [1, 2, 3]
    for info in saved:
        manifest = loads(info.manifest_path.read_text())
        assert "val_r2" not in manifest["metrics"] and "val_loss" in manifest["metrics"]
    lines = records(folder)
    assert [line["val_r2"] for line in lines if line["kind"] == "epoch"] == [None] * 3
    assert lines[-1]["kind"] == "end" and lines[-1]["status"] == "finished"
    assert lines[-1]["best"] is None
    told = [str(warning.message) for warning in warned if "val_r2" in str(warning.message)]
    assert told == ["ipycloud.fit: val_r2 is NaN at epoch 0: a value that is not a finite "
                    "number counts neither as the best (keep_best) nor as an improvement "
                    "(EarlyStopping)"]
    assert [line["message"] for line in lines if line["kind"] == "event"] == told


@pytest.mark.parametrize("beyond", [INF, 10**400], ids=["infinity", "int beyond a float"])
def test_keep_best_never_takes_a_nan_or_infinite_metric_as_the_best(tmp_path: Path,
                                                                   beyond: Any) -> None:
    folder = tmp_path / "run"
    manager = ipycloud.CheckpointManager(folder, keep_last=1, keep_best=("val_r2", "max"))

    history = train([0.25, NAN, beyond, 0.125], manager)

    assert [info.epoch for info in manager.list()] == [1, 4]  # the best, and the newest
    state = {"model": problem(32)[0]}
    assert manager.load(state, which="best").epoch == 1
    end = records(folder)[-1]
    assert end["best"] == {"metric": "val_r2", "value": 0.25, "epoch": 0}
    assert history.epochs[2]["val_r2"] == INF


def test_a_manifest_written_with_a_nan_metric_never_ranks_best(tmp_path: Path) -> None:
    """A folder from elsewhere: manifests holding NaN and Infinity (Python's json writes
    them) are read, and their metrics rank nothing."""
    folder = tmp_path / "run"
    manager = ipycloud.CheckpointManager(folder, keep_last=None)
    model = problem(32)[0]
    for step, value in enumerate([0.5, 0.75, 1.0]):
        manager.save({"model": model}, step, metrics={"val_r2": value})
    for info, value in zip(manager.list()[1:], [INF, NAN], strict=True):
        manifest = json.loads(info.manifest_path.read_text())
        manifest["metrics"]["val_r2"] = value
        info.manifest_path.write_text(json.dumps(manifest))

    assert manager.load({"model": model}, which="best", best_by=("val_r2", "max")).step == 0


@pytest.mark.parametrize(("values", "stopped"), [
    ([NAN, 0.5, INF, 0.25, 0.125, 0.0625], "since epoch 1 (0.5) (step 16)"),
    ([NAN, 0.5, NAN, 0.75], None),
])
def test_early_stop_never_counts_a_nan_or_infinite_metric_as_an_improvement(
        values: list[float], stopped: str | None) -> None:
    history = train(values, callbacks=[EarlyStopping("val_r2", patience=2, mode="max")])

    if stopped is None:
        assert history.stopped is None and len(history.epochs) == len(values)
    else:
        assert history.stopped == f"early stop: val_r2 has not improved for 2 epochs {stopped}"
        assert len(history.epochs) == 4


def test_early_stop_on_a_metric_that_never_was_a_number_says_so() -> None:
    history = train([NAN, NAN, NAN, NAN],
                    callbacks=[EarlyStopping("val_r2", patience=2, mode="max")])

    assert history.stopped == ("early stop: val_r2 has not been a finite number for 2 epochs "
                               "(step 8)")
    assert len(history.epochs) == 2


def test_a_record_line_holds_a_nan_or_infinite_tensor_as_null() -> None:
    import torch

    from ipycloud.runtime.runs.records import encode

    line = encode({"t": 1.5, "kind": "epoch", "epoch": 0, "val_r2": torch.tensor(NAN),
                   "val_f1": torch.tensor(-INF), "val_loss": torch.tensor(0.5)})
    assert loads(line.decode()) == {"t": 1.5, "kind": "epoch", "epoch": 0, "val_r2": None,
                                     "val_f1": None, "val_loss": 0.5}
