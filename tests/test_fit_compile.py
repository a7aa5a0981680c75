"""fit(compile=...) on the CPU with torch's real compiler (inductor, C++): each run a fresh
interpreter with a fresh inductor cache folder, as a new session on a new machine has."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import differences

from ipycloud.runtime.train.compiled import (
    ARTIFACTS,
    CACHE_FOLDER,
    check_compile,
    repeated_blocks,
)

SCRIPT = Path(__file__).with_name("compiled_training.py")
TIMEOUT_S = 600


def training(folder: Path, out: Path, *options: str) -> tuple[int, str]:
    """Run the script in a new session: its own, empty, inductor cache folder."""
    inductor = folder.parent / f"inductor-{len(list(folder.parent.glob('inductor-*')))}"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    done = subprocess.run([sys.executable, str(SCRIPT), str(folder), str(out), *options],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    return done.returncode, done.stdout + done.stderr


def result(out: Path) -> dict[str, Any]:
    data = json.loads(out.read_text())
    data["state"] = {name: torch.tensor(value) for name, value in data["state"].items()}
    return data


def test_the_next_session_loads_the_saved_compile_caches(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    code, text = training(folder, tmp_path / "first.json")
    assert code == 0, text
    assert "ipycloud.fit: compiling the whole model, with no saved caches" in text
    saved = list((folder / CACHE_FOLDER).glob("torch-*-cpu.tar"))
    assert len(saved) == 1 and saved[0].stat().st_size > 0, text
    first = result(tmp_path / "first.json")
    assert first["cache_hits"] == 0
    # The next session trains a new run whose folder holds the caches the first one saved.
    (tmp_path / "next").mkdir()
    shutil.copytree(folder / CACHE_FOLDER, tmp_path / "next" / CACHE_FOLDER)
    code, text = training(tmp_path / "next", tmp_path / "next.json")
    assert code == 0, text
    assert f"from the caches saved in {tmp_path / 'next' / CACHE_FOLDER}" in text
    following = result(tmp_path / "next.json")
    assert following["cache_hits"] >= 1  # the compiled graph came from the saved caches
    assert differences(following["state"], first["state"]) == []
    # The bytes torch hands out are loaded too, not only the built kernels beside them: a
    # cache file holding the bytes alone still gives the next session its graphs.
    (tmp_path / "bytes" / CACHE_FOLDER).mkdir(parents=True)
    with tarfile.open(saved[0]) as whole, \
            tarfile.open(tmp_path / "bytes" / CACHE_FOLDER / saved[0].name, "w") as alone:
        alone.addfile(whole.getmember(ARTIFACTS), whole.extractfile(ARTIFACTS))
    code, text = training(tmp_path / "bytes", tmp_path / "bytes.json")
    assert code == 0 and "from the caches saved in" in text, text
    assert result(tmp_path / "bytes.json")["cache_hits"] >= 1


def test_the_last_partial_batch_and_validation_compile_nothing_more(tmp_path: Path) -> None:
    code, text = training(tmp_path / "run", tmp_path / "out.json", "--samples", "42")
    assert code == 0, text
    out = result(tmp_path / "out.json")
    assert out["graphs"] == 1  # batches of 4 only; the 2 and validation ran eagerly
    assert out["own_forwards"]  # after the run, the model is as it was given


def test_repeated_blocks_are_compiled_regionally(tmp_path: Path) -> None:
    code, text = training(tmp_path / "run", tmp_path / "out.json", "--model", "blocks")
    assert code == 0, text
    assert "ipycloud.fit: compiling 3 repeated blocks (Block), with no saved caches" in text
    assert result(tmp_path / "out.json")["own_forwards"]
    code, text = training(tmp_path / "whole", tmp_path / "whole.json", "--model", "blocks",
                          "--compile", "whole")
    assert code == 0 and "compiling the whole model" in text, text


def test_compile_giving_up_on_recompiles_is_said_once(tmp_path: Path) -> None:
    code, text = training(tmp_path / "run", tmp_path / "out.json", "--model", "counting",
                          "--samples", "12")
    assert code == 0, text
    said = [line for line in text.splitlines() if "compile gave up" in line]
    assert len(said) == 1, text
    assert said[0].startswith("ipycloud.fit: compile gave up on forward after 2 recompiles "
                              "(torch._dynamo.config.recompile_limit): it runs eagerly from "
                              "there; give its inputs steady shapes"), said


def test_a_compile_that_fails_falls_back_to_eager_in_one_line(tmp_path: Path) -> None:
    code, text = training(tmp_path / "run", tmp_path / "out.json", "--fail-compile")
    assert code == 0, text
    lines = [line for line in text.splitlines() if "compile failed" in line]
    assert len(lines) == 1 and lines[0].startswith("ipycloud.fit: compile failed (") \
        and "/no/such/g++" in lines[0] \
        and lines[0].endswith("training eagerly from here on"), text
    code, text = training(tmp_path / "eager", tmp_path / "eager.json", "--compile", "false")
    assert code == 0, text
    assert differences(result(tmp_path / "out.json")["state"],
                       result(tmp_path / "eager.json")["state"]) == []


def test_an_interrupted_compiled_run_resumes_exactly_in_the_next_session(
        tmp_path: Path) -> None:
    code, text = training(tmp_path / "whole", tmp_path / "whole.json")
    assert code == 0, text
    code, text = training(tmp_path / "run", tmp_path / "out.json", "--interrupt-at", "7")
    assert code == 3 and "interrupted at step 7" in text, text
    code, text = training(tmp_path / "run", tmp_path / "out.json")
    assert code == 0 and "from the caches saved in" in text, text
    assert differences(result(tmp_path / "out.json")["state"],
                       result(tmp_path / "whole.json")["state"]) == []


@pytest.mark.parametrize(("value", "message"), [
    ("yes", "compile must be False, True (regional where the model repeats blocks, else "
            "whole), 'whole' or 'regional', not 'yes'"),
    (1, "compile must be False, True"),
])
def test_a_compile_fit_cannot_do_is_one_line(value: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_compile(value, torch.device("cpu"), "cpu")
    assert str(caught.value).startswith(message)


def test_compile_is_refused_on_xla_and_on_a_gpu_older_than_volta(board: Any) -> None:
    with pytest.raises(ValueError, match=r"^compile runs on CUDA GPUs and CPUs, not on xla "
                                         r"devices: leave compile off$"):
        check_compile(True, torch.device("cpu"), "xla")
    board("1xP100")
    with pytest.raises(ValueError, match=r"^compile needs a GPU of compute capability 7.0 or "
                                         r"newer \(Triton\) and the Tesla P100-PCIE-16GB is "
                                         r"6.0: leave compile off$"):
        check_compile(True, torch.device("cuda", 0), "cuda")
    check_compile(False, torch.device("cuda", 0), "cuda")  # off: nothing to refuse


def test_repeated_blocks_are_the_longest_run_of_alike_blocks() -> None:
    def block(width: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())

    layers = torch.nn.ModuleList([block(4) for _ in range(3)])
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
                                torch.nn.Sequential(block(4), block(8)), layers)
    assert repeated_blocks(model) == list(layers)
    # Layers of a plain MLP are no blocks: single modules, of different shapes.
    assert repeated_blocks(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                               torch.nn.Linear(8, 8))) == []
