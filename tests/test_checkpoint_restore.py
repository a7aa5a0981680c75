"""A restore that fails changes nothing: every live object is checked before any is written."""

from __future__ import annotations

import copy
import re
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import differences
from torch import nn

from ipycloud.runtime.checkpoint import CheckpointError, CheckpointManager


def small_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))


def trained(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Two real steps, so the optimizer holds moments for every parameter."""
    for _ in range(2):
        inputs = torch.randn(16, 6)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), inputs[:, :3]).backward()
        optimizer.step()


def two_groups(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with the weights decayed and the biases and norm parameters not."""
    decayed = [p for name, p in model.named_parameters() if name.endswith("weight")
               and p.dim() == 2]
    rest = [p for name, p in model.named_parameters() if not (name.endswith("weight")
                                                              and p.dim() == 2)]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=1e-2)


def saved_run(folder: Path) -> CheckpointManager:
    """A checkpoint of a trained model, its two-group AdamW and a few other objects."""
    model = small_model(0)
    optimizer = two_groups(model)
    trained(model, optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    manager = CheckpointManager(folder)
    manager.save({"model": model, "optimizer": optimizer, "scaler": scaler,
                  "weights": torch.arange(5.0), "step": 2}, step=2)
    return manager


def live_run(seed: int = 1) -> dict[str, Any]:
    model = small_model(seed)
    optimizer = two_groups(model)
    trained(model, optimizer)
    return {"model": model, "optimizer": optimizer,
            "scaler": torch.amp.GradScaler("cpu", init_scale=8.0),
            "weights": torch.zeros(5), "step": None}


def snapshot(state: dict[str, Any]) -> dict[str, Any]:
    return {name: copy.deepcopy(obj.state_dict() if hasattr(obj, "state_dict") else obj)
            for name, obj in state.items()}


def assert_refused_and_untouched(manager: CheckpointManager, state: dict[str, Any],
                                 pattern: str) -> None:
    before = snapshot(state)
    with pytest.raises(CheckpointError) as refused:
        manager.load(state)
    assert differences(snapshot(state), before) == []
    assert re.search(pattern, str(refused.value)), refused.value
    assert "\n" not in str(refused.value)


def test_an_optimizer_with_other_parameter_groups_leaves_the_model_untouched(
        tmp_path: Path) -> None:
    manager = saved_run(tmp_path / "run")
    state = live_run()
    model = state["model"]
    state["optimizer"] = torch.optim.AdamW(model.parameters(), lr=1e-2)  # one group
    trained(model, state["optimizer"])
    assert_refused_and_untouched(
        manager, state, r"^cannot restore 'optimizer': the checkpoint's optimizer has 2 "
                        r"parameter groups, the live one 1$")


def test_a_group_with_another_number_of_parameters_is_refused(tmp_path: Path) -> None:
    manager = saved_run(tmp_path / "run")
    state = live_run()
    model = state["model"]
    params = list(model.parameters())
    state["optimizer"] = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:]}])
    assert_refused_and_untouched(
        manager, state, r"^cannot restore 'optimizer': parameter group 0 holds 2 parameters"
                        r" in the checkpoint, 1 in the live optimizer$")


def test_parameters_of_other_shapes_are_refused_even_for_a_fresh_optimizer(
        tmp_path: Path) -> None:
    manager = saved_run(tmp_path / "run")
    other = nn.Sequential(nn.Linear(8, 6), nn.LayerNorm(6), nn.ReLU(), nn.Linear(6, 3))
    state = {**live_run(), "optimizer": two_groups(other)}  # no step taken: no state yet
    del state["model"]
    assert_refused_and_untouched(
        manager, state, r"^cannot restore 'optimizer': parameter 0 of group 0 has shape "
                        r"\(8, 6\) in the checkpoint, \(6, 8\) in the live optimizer$")


def test_a_scaler_saved_while_disabled_is_refused(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "run")
    manager.save({"weights": torch.ones(3),
                  "scaler": torch.amp.GradScaler("cpu", enabled=False)}, step=1)
    state = {"weights": torch.zeros(3), "scaler": torch.amp.GradScaler("cpu")}
    assert_refused_and_untouched(
        manager, state, r"^cannot restore 'scaler': the checkpoint holds the state of a "
                        r"disabled GradScaler$")


def test_an_object_of_another_kind_is_refused(tmp_path: Path) -> None:
    manager = saved_run(tmp_path / "run")
    state = live_run()
    state["weights"] = nn.Linear(5, 1)
    assert_refused_and_untouched(
        manager, state, r"^cannot restore 'weights': the checkpoint holds a tensor, the live "
                        r"object is an object's state_dict\(\)$")


def test_a_plain_value_into_a_read_only_mapping_is_refused_first(tmp_path: Path) -> None:
    manager = saved_run(tmp_path / "run")
    state = live_run()
    before = snapshot(state)
    with pytest.raises(CheckpointError, match=r"'step': a plain value cannot be put back"):
        manager.load(types.MappingProxyType(state))
    assert differences(snapshot(state), before) == []


class Refusing:
    """A stateful object whose load_state_dict fails: nothing can check that beforehand."""

    def state_dict(self) -> dict[str, Any]:
        return {"position": 3}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise ValueError("position 3 is past the end of this data set")


def test_objects_that_cannot_be_checked_are_restored_before_the_others(tmp_path: Path) -> None:
    manager = saved_run(tmp_path / "run")
    manager.save({**live_run(seed=0), "sampler": Refusing()}, step=3)
    state = {**live_run(), "sampler": Refusing()}  # after the model, in the mapping's order
    assert_refused_and_untouched(
        manager, state, r"^cannot restore 'sampler': position 3 is past the end")


def test_a_matching_state_is_restored_whole(tmp_path: Path) -> None:
    manager = saved_run(tmp_path / "run")
    state = live_run()
    info = manager.load(state)
    saved = torch.load(info.data_path, weights_only=True)["state"]
    assert differences(state["model"].state_dict(), saved["model"]) == []
    assert differences(state["optimizer"].state_dict(), saved["optimizer"]) == []
    assert state["scaler"].get_scale() == 256.0
    assert torch.equal(state["weights"], torch.arange(5.0)) and state["step"] == 2
