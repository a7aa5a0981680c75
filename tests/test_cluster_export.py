"""``ipycloud.cluster.export``: the task it writes (read back by SkyPilot's own parser in
the cluster lane, scripts/test_cluster.sh), the pins, the pickled function loaded by a
fresh interpreter, every refusal, ``checkpoint_dir`` and the command line."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import os
import pickle
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import tanh as torch_tanh

from ipycloud.runtime.cluster import ClusterWarning, ExportError, checkpoint_dir, export
from ipycloud.runtime.cluster.function_file import PayloadError, load_payload
from ipycloud.runtime.cluster.options import CHECKPOINT_MOUNT, CHECKPOINT_SCHEMES, DATA_SCHEMES
from ipycloud.runtime.cluster.yaml_text import to_yaml

REPO = Path(__file__).resolve().parents[1]
BUCKET = "s3://checkpoints/run-1"
HAS_SKYPILOT = importlib.util.find_spec("sky") is not None


def needs_skypilot(test: Callable[..., None]) -> Callable[..., None]:
    """A test of SkyPilot's view of the task: run by scripts/test_cluster.sh, in the venv
    that has SkyPilot (its click pin holds back the test tools of the main one)."""
    skip = pytest.mark.skipif(not HAS_SKYPILOT, reason="SkyPilot is not installed here: "
                              "scripts/test_cluster.sh runs this in a venv of its own")
    return pytest.mark.skypilot(skip(test))


def installed_pin(distribution: str) -> str:
    """``name==version`` from what is installed, without a local build tag."""
    return f"{distribution}=={importlib.metadata.version(distribution).split('+')[0]}"


def requirements(folder: Path) -> list[str]:
    return [line for line in (folder / "requirements.txt").read_text().splitlines()
            if line and not line.startswith("#")]


def last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


def launch_path(line: str) -> Path:
    """The task file the line's ``sky jobs launch ...`` command names (as a shell reads it)."""
    words = shlex.split(line[line.index("sky jobs launch "):])
    assert words[:3] == ["sky", "jobs", "launch"] and len(words) == 4, line
    return Path(words[3])


# -- the training a notebook defines --------------------------------------------------------


class Scaled:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def apply(self, value: float) -> float:
        return self.factor * value + OFFSET


OFFSET = 0.5


def train_in_the_test(values: list[float], factor: float = 2.0) -> dict[str, Any]:
    """Uses a class and a constant of this module (which a node cannot import), torch from
    its globals, numpy imported in its body and json from the standard library."""
    import numpy as np

    scaled = [Scaled(factor).apply(value) for value in values]
    return {"sum": float(np.sum(scaled)), "tensor": torch.tensor(scaled).tolist(),
            "text": json.dumps(scaled)}


def test_a_function_is_pickled_by_value_and_runs_in_a_fresh_interpreter(
        tmp_path: Path) -> None:
    folder = tmp_path / "task"
    export(train_in_the_test, folder=folder, bucket=BUCKET, args=([1.0, 2.5],),
           kwargs={"factor": 3.0})
    loaded = subprocess.run(
        [sys.executable, "-c", "import json, sys\n"
         "from ipycloud.runtime.cluster.function_file import load_payload\n"
         "fn, args, kwargs = load_payload(sys.argv[1])\n"
         "print(json.dumps(fn(*args, **kwargs)))", str(folder / "train.pkl")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)})  # tests/ is not on its path
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout) == train_in_the_test([1.0, 2.5], factor=3.0)


NOTEBOOK_CELL = """
import sys
import ipycloud
import helpers_beside_the_notebook as helpers

class Model:
    def __init__(self, width):
        self.width = width

def train(steps, model):
    return {"steps": steps, "width": model.width, "helped": helpers.double(steps)}

print(ipycloud.cluster.export(train, folder=sys.argv[1], bucket="gs://ckpt", nodes=2,
                              args=(7, Model(16))))
"""


def test_a_notebook_function_and_its_local_module_travel_by_value(tmp_path: Path) -> None:
    """As in a notebook: the function and a class live in __main__, a helper in a .py file
    beside it; the node has neither."""
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    (notebook / "helpers_beside_the_notebook.py").write_text("def double(x):\n"
                                                             "    return 2 * x\n")
    folder = tmp_path / "task"
    exported = subprocess.run([sys.executable, "-c", NOTEBOOK_CELL, str(folder)],
                              capture_output=True, text=True, timeout=120, cwd=notebook,
                              env={**os.environ, "PYTHONPATH": f"{REPO}:{notebook}"})
    assert exported.returncode == 0, exported.stderr
    loaded = subprocess.run(
        [sys.executable, "-c", "import json, sys\n"
         "from ipycloud.runtime.cluster.function_file import load_payload\n"
         "fn, args, kwargs = load_payload('train.pkl')\n"
         "print(json.dumps(fn(*args, **kwargs)))"],
        capture_output=True, text=True, timeout=120, cwd=folder,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout) == {"steps": 7, "width": 16, "helped": 14}
    assert requirements(folder) == sorted([installed_pin("cloudpickle"),
                                           installed_pin("ipycloud")], key=str.lower)


def test_the_pins_are_the_versions_installed_here(tmp_path: Path) -> None:
    folder = tmp_path / "task"
    task = export(train_in_the_test, folder=folder, bucket=BUCKET, args=([1.0],))
    expected = sorted((installed_pin(name) for name in
                       ("cloudpickle", "ipycloud", "numpy", "torch")), key=str.lower)
    assert requirements(folder) == expected  # json is the standard library's: not pinned
    torch_version = importlib.metadata.version("torch")
    if "+" in torch_version:  # a local build (+cpu, +cu121): said, in the file and the text
        assert (f"# torch {torch_version} here: pinned without its local build tag, PyPI's "
                "build for the node") in (folder / "requirements.txt").read_text()
        assert f"{installed_pin('torch')} ({torch_version} here: local build tag dropped)" \
            in str(task)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    setup = yaml.safe_load((folder / "task.yaml").read_text())["setup"]
    assert f"uv venv --python {python} " in setup
    assert 'uv pip install --python "$venv/bin/python" -r requirements.txt' in setup


def uses_a_torch_builtin(x: torch.Tensor) -> torch.Tensor:
    return torch_tanh(x)  # a C function of torch's, by its own name


def test_a_function_named_from_a_package_pins_that_package(tmp_path: Path) -> None:
    export(uses_a_torch_builtin, folder=tmp_path / "task", bucket=BUCKET)
    assert requirements(tmp_path / "task") == sorted(
        (installed_pin(name) for name in ("cloudpickle", "ipycloud", "torch")), key=str.lower)


SCRIPT = """
import os.path
import torch
from numpy import linalg
try:
    import a_module_nobody_installed
except ImportError:
    a_module_nobody_installed = None
from . import sibling
"""


def test_a_scripts_imports_are_read_without_running_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    folder = tmp_path / "task"
    task = export(script, folder=folder, bucket=BUCKET, args=["--lr", 0.1])
    assert requirements(folder) == sorted((installed_pin(name) for name in
                                           ("cloudpickle", "ipycloud", "numpy", "torch")),
                                          key=str.lower)
    assert "not pinned, as no installed package provides them: a_module_nobody_installed" \
        in str(task).splitlines()
    assert (folder / "train.py").read_text() == SCRIPT
    run = yaml.safe_load((folder / "task.yaml").read_text())["run"]
    assert run.rstrip().endswith("--max-restarts=3 \\\n  train.py --lr 0.1")


def test_without_skypilot_the_last_line_says_how_to_get_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)  # as where it is not installed
    folder = tmp_path / "my 'task' folder"
    task = export(train_in_the_test, folder=folder, bucket=BUCKET, args=([1.0],))
    line = last_line(str(task))
    assert line.startswith("SkyPilot is not installed here: pip install 'ipycloud[cluster]',"
                           " then sky jobs launch ")
    assert launch_path(line) == folder / "task.yaml"
    assert sorted(path.name for path in folder.iterdir()) == ["requirements.txt", "task.yaml",
                                                               "train.pkl"]


def test_the_task_names_the_bucket_the_mounts_and_the_torchrun_command(tmp_path: Path) -> None:
    local = tmp_path / "local data"
    local.mkdir()
    folder = tmp_path / "task"
    export(train_in_the_test, folder=folder, bucket=BUCKET, nodes=3, accelerators="H100:8",
           data={"/data": "gs://my-data/train", "~/extra": local}, args=([1.0],),
           max_restarts=5, use_spot=True, name="resnet-50")
    task = yaml.safe_load((folder / "task.yaml").read_text())
    assert task["name"] == "resnet-50" and task["num_nodes"] == 3
    assert task["resources"] == {"accelerators": "H100:8", "use_spot": True,
                                 "job_recovery": {"strategy": "EAGER_NEXT_REGION"}}
    assert task["workdir"] == str(folder)
    assert task["file_mounts"] == {
        CHECKPOINT_MOUNT: {"source": BUCKET, "mode": "MOUNT_CACHED"},
        "/data": {"source": "gs://my-data/train", "mode": "MOUNT"},
        "~/extra": str(local)}
    assert task["envs"] == {"IPYCLOUD_CHECKPOINT_DIR": CHECKPOINT_MOUNT,
                            "IPYCLOUD_RDZV_PORT": "29500"}
    assert ("--max-restarts=5 \\\n  -m ipycloud.runtime.cluster.worker train.pkl"
            in task["run"])


def test_a_large_pickle_is_named_in_one_warning(tmp_path: Path) -> None:
    data = bytes(11 * 2**20)

    def closes_over_data() -> int:
        return len(data)

    with pytest.warns(ClusterWarning) as caught:
        export(closes_over_data, folder=tmp_path / "task", bucket=BUCKET)
    assert [str(warning.message) for warning in caught] == [
        "train.pkl is 11.0 MiB: closes_over_data or its arguments hold data; load it inside "
        "the function, or from a bucket mounted with data="]


def test_a_payload_from_another_python_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "task"
    export(train_in_the_test, folder=folder, bucket=BUCKET, args=([1.0],))
    payload = folder / "train.pkl"
    stream = io.BytesIO(payload.read_bytes())
    header = pickle.load(stream)
    payload.write_bytes(pickle.dumps({**header, "python": "3.9"}) + stream.read())
    with pytest.raises(PayloadError, match=r"train_in_the_test pickled by Python 3\.9, which "
                       r"Python 3\.\d+ cannot load: run it with Python 3\.9"):
        load_payload(payload)
    worker = subprocess.run([sys.executable, "-m", "ipycloud.runtime.cluster.worker",
                             "train.pkl"], capture_output=True, text=True, timeout=120,
                            cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert worker.returncode == 1
    assert worker.stderr.startswith("ipycloud worker: train.pkl holds train_in_the_test "
                                    "pickled by Python 3.9")
    assert worker.stderr.count("\n") == 1


# -- refusals: one line, nothing written ---------------------------------------------------


def unpicklable() -> Callable[[], None]:
    lock = threading.Lock()

    def holds_a_lock() -> None:
        with lock:
            pass

    return holds_a_lock


REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"nodes": 0}, r"^nodes must be a whole number of nodes, at least 1, not 0$"),
    ({"nodes": True}, r"^nodes must be a whole number of nodes, at least 1, not True$"),
    ({"accelerators": "A100:x"}, r"^accelerators must name an accelerator and how many each "
                                 r"node has, like 'A100:8' or 'H100', not 'A100:x'$"),
    ({"accelerators": "A100:0"}, r"not 'A100:0'$"),
    ({"bucket": "ftp://host/ckpt"}, r"^bucket: 'ftp://host/ckpt' is not a bucket SkyPilot "
                                    r"mounts for checkpoints: give one of s3://, gs://, "),
    ({"bucket": "s3://"}, r"^bucket: 's3://' is not a bucket"),
    ({"bucket": "https://example.com/ckpt"}, r"^bucket: 'https://example.com/ckpt' is not"),
    ({"bucket": "cos://us-east/ckpt"}, r"^bucket: 'cos://us-east/ckpt' is not a bucket "
                                       r"SkyPilot mounts for checkpoints"),
    ({"data": {"data": "s3://my-data"}}, r"^data: a mount path must be absolute on the nodes, "
                                         r"like '/data' or '~/data', not 'data'$"),
    ({"data": {"/data": "nowhere/here"}}, r"^data: 'nowhere/here' \(for /data\) is neither a "
                                          r"bucket URL nor a file or folder here$"),
    ({"data": {"/ipycloud": "s3://x"}}, r"^data: '/ipycloud' overlaps the checkpoint "
                                        r"bucket's mount at /ipycloud/checkpoints$"),
    ({"data": {"/data": "ftp://x/y"}}, r"^data: 'ftp://x/y' is not a bucket SkyPilot mounts "
                                       r"for data"),
    ({"max_restarts": -1}, r"^max_restarts must be a whole number, 0 or more, not -1$"),
    ({"name": "my task"}, r"^name must be letters and digits joined by '\.', '_' or '-'"),
    ({"train": lambda: None}, r"^train is a lambda: define the training function with def$"),
    ({"train": unpicklable()}, r"^cannot pickle holds_a_lock with its arguments \(TypeError: "
                               r"cannot pickle '_thread\.lock' object\): make such objects "
                               r"inside the function$"),
    ({"train": 42}, r"^train must be a training function or a script's path, not 42$"),
    ({"train": "no such script.py"}, r"^no script 'no such script\.py': give the path of a "
                                     r"Python file$"),
]


@pytest.mark.parametrize(("change", "message"), REFUSALS)
def test_a_choice_that_cannot_work_is_refused_in_one_line_and_nothing_is_written(
        change: dict[str, Any], message: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    choices: dict[str, Any] = {"train": train_in_the_test, "folder": tmp_path / "task",
                               "bucket": BUCKET, "args": ([1.0],), **change}
    with pytest.raises(ExportError, match=message) as refused:
        export(choices.pop("train"), **choices)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "task").exists()


def test_a_refusal_leaves_an_earlier_export_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "task"
    export(train_in_the_test, folder=folder, bucket=BUCKET, args=([1.0],))
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with pytest.raises(ExportError):
        export(train_in_the_test, folder=folder, bucket=BUCKET, nodes=0, args=([1.0],))
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_a_folder_that_is_a_file_and_a_script_that_is_not_python_are_refused(
        tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("mine")
    with pytest.raises(ExportError, match=rf"^folder: {taken} is a file, not a folder$"):
        export(train_in_the_test, folder=taken / "task", bucket=BUCKET)
    assert taken.read_text() == "mine"
    binary = tmp_path / "model.py"
    binary.write_bytes(b"\x80\x81 not text")
    with pytest.raises(ExportError, match=r"model\.py' is not a Python script: "
                                          r"UnicodeDecodeError"):
        export(binary, folder=tmp_path / "task", bucket=BUCKET)
    with pytest.raises(ExportError, match=r"^kwargs are for a function: a script takes args, "
                                          r"its command line$"):
        export(binary, folder=tmp_path / "task", bucket=BUCKET, kwargs={"lr": 0.1})
    assert not (tmp_path / "task").exists()


# -- names and paths at the edges ---------------------------------------------------------


def shell_reads(word: str) -> str:
    """What bash makes of ``word`` (a command line's word as ipycloud writes it)."""
    result = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True,
                            timeout=60, check=True)
    return os.fsdecode(result.stdout)


def launch_word(line: str) -> str:
    """The task file's word in a ``sky jobs launch WORD`` line, as written."""
    return line[line.index("sky jobs launch ") + len("sky jobs launch "):]


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(blacklist_characters="/\x00"), min_size=1, max_size=12)
       .filter(lambda name: name not in (".", "..")))
def test_any_folder_script_and_argument_make_a_task_yaml_reads_or_one_line(
        name: str, tmp_path: Path) -> None:
    case = tmp_path / f"{len(list(tmp_path.iterdir()))}"
    case.mkdir()
    script = case / f"{name}.py"
    try:
        script.write_text("import os\n")
    except (OSError, UnicodeEncodeError):
        return  # a name this file system cannot hold
    folder = case / f"task {name}"
    try:
        task = export(script, folder=folder, bucket=BUCKET, args=["--note", name])
    except ExportError as refused:
        assert "\n" not in str(refused)
        assert "is not UTF-8 text" in str(refused)
        with pytest.raises(UnicodeEncodeError):
            name.encode()
        return
    read = yaml.safe_load((folder / "task.yaml").read_text(encoding="utf-8"))
    assert read["workdir"] == str(folder)
    comment = (folder / "task.yaml").read_text(encoding="utf-8").splitlines()[2]
    assert shell_reads(launch_word(comment)) == str(folder / "task.yaml")
    assert shell_reads(launch_word(last_line(str(task)))) == str(folder / "task.yaml")
    run = read["run"].rsplit("\n  ", 1)[1]
    assert shlex.split(run)[-2:] == ["--note", name]


@pytest.mark.parametrize("name", ["bell\x07", "escape\x1b[31m", "new\nline", "tab\there",
                                  "del\x7f", "nbsp\u00a0", "line\u2028separator"])
def test_a_folder_with_a_control_character_gives_a_task_yaml_parsers_read(
        name: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import os\n")
    folder = tmp_path / name
    task = export(tmp_path / "train.py", folder=folder, bucket=BUCKET)
    text = (folder / "task.yaml").read_text(encoding="utf-8")
    assert yaml.safe_load(text)["workdir"] == str(folder)
    assert shell_reads(launch_word(text.splitlines()[2])) == str(folder / "task.yaml")
    assert shell_reads(launch_word(last_line(str(task)))) == str(folder / "task.yaml")


NOT_UTF8 = os.fsdecode(b"run\xff")


@pytest.mark.parametrize(("change", "message"), [
    ({"folder": NOT_UTF8}, r"^folder: '.*/run\\udcff' is not UTF-8 text, which a task "
                           r"file must be: rename it$"),
    ({"args": ["--note", NOT_UTF8]}, r"^args: 'run\\udcff' is not UTF-8 text"),
    ({"bucket": f"s3://{NOT_UTF8}"}, r"^bucket: 's3://run\\udcff' is not UTF-8 text"),
    ({"data": {f"/{NOT_UTF8}": "s3://data"}}, r"^data: '/run\\udcff' is not UTF-8 text"),
    ({"data": {"/data": NOT_UTF8}}, r"^data: '.*/run\\udcff' is not UTF-8 text"),
    ({"train": f"{NOT_UTF8}.py"}, r"^train: 'run\\udcff\.py' is not UTF-8 text"),
])
def test_a_name_that_is_not_utf8_is_refused_in_one_line(
        change: dict[str, Any], message: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in (f"{NOT_UTF8}.py", "train.py"):
        (tmp_path / name).write_text("import os\n")
    (tmp_path / NOT_UTF8).mkdir()
    choices: dict[str, Any] = {"train": "train.py", "folder": tmp_path / "task",
                               "bucket": BUCKET, **change}
    with pytest.raises(ExportError, match=message):
        export(choices.pop("train"), **choices)
    assert not (tmp_path / "task").exists()


def test_the_command_refuses_a_folder_name_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    result = subprocess.run([sys.executable, "-m", "ipycloud", "cluster", "export", "--folder",
                             b"run\xff", "--bucket", "s3://b", "train.py"], capture_output=True,
                            timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (result.returncode, result.stderr, result.stdout) == (
        1, b"ipycloud cluster export: --folder: '" + os.fsencode(tmp_path) + b"/run\\udcff' "
           b"is not UTF-8 text, which a task file must be: rename it\n", b"")


@pytest.mark.parametrize("path", ["//ipycloud/checkpoints", "/ipycloud//checkpoints/",
                                  "/ipycloud/./checkpoints/run", "//ipycloud"])
def test_a_mount_path_written_another_way_still_overlaps_the_checkpoints(
        path: str, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=rf"^data: {re.escape(repr(path))} overlaps the "
                                          r"checkpoint bucket's mount at /ipycloud/checkpoints$"):
        export(train_in_the_test, folder=tmp_path / "task", bucket=BUCKET,
               data={path: "s3://data"})
    assert not (tmp_path / "task").exists()


def test_one_mount_path_written_two_ways_is_refused_and_each_is_written_plainly(
        tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"^data: '/data/' and '/\./data' are the mount path "
                                          r"/data given twice: give it once$"):
        export(train_in_the_test, folder=tmp_path / "task", bucket=BUCKET,
               data={"/data/": "s3://x", "/./data": "s3://y"})
    assert not (tmp_path / "task").exists()
    export(train_in_the_test, folder=tmp_path / "task", bucket=BUCKET, args=([1.0],),
           data={"//data/": "s3://x", "~/./extra//": "s3://y"})
    mounts = yaml.safe_load((tmp_path / "task" / "task.yaml").read_text())["file_mounts"]
    assert sorted(mounts) == ["/data", CHECKPOINT_MOUNT, "~/extra"]


def test_a_script_named_like_an_option_is_the_script_torchrun_runs(tmp_path: Path) -> None:
    from torch.distributed.run import get_args_parser

    for name in ("-m.py", "--help.py", "-"):
        script = tmp_path / name
        script.write_text("import os\n")
        folder = tmp_path / f"task{name}"
        export(script, folder=folder, bucket=BUCKET, args=["-m", "--lr", "0.1"])
        run = yaml.safe_load((folder / "task.yaml").read_text())["run"]
        torchrun_words = shlex.split(run[run.index("--nnodes"):].replace("\\\n", " "))
        parsed = get_args_parser().parse_args(torchrun_words)
        assert not parsed.module
        assert (folder / parsed.training_script).resolve() == folder / name
        assert parsed.training_script_args == ["-m", "--lr", "0.1"]


# -- checkpoint_dir ------------------------------------------------------------------------


def test_checkpoint_dir_is_the_mounted_bucket_on_the_cluster_and_the_default_elsewhere(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("IPYCLOUD_CHECKPOINT_DIR", raising=False)
    assert checkpoint_dir(tmp_path / "local") == str(tmp_path / "local")
    assert checkpoint_dir("local", "run-1") == "local"
    monkeypatch.setenv("IPYCLOUD_CHECKPOINT_DIR", "")
    assert checkpoint_dir("local") == "local"
    monkeypatch.setenv("IPYCLOUD_CHECKPOINT_DIR", CHECKPOINT_MOUNT)
    assert checkpoint_dir("local") == CHECKPOINT_MOUNT
    assert checkpoint_dir("local", "resnet/lr-0.1") == f"{CHECKPOINT_MOUNT}/resnet/lr-0.1"
    for outside in ("../elsewhere", "/etc", "a/../../b", ""):
        with pytest.raises(ValueError, match="subfolder must be a relative path inside"):
            checkpoint_dir("local", outside)


def test_the_public_namespace_loads_on_first_use() -> None:
    code = ("import sys, ipycloud\n"
            "assert 'ipycloud.cluster' not in sys.modules\n"
            "from ipycloud.runtime.cluster import export\n"
            "assert ipycloud.cluster.export is export and 'torch' not in sys.modules\n"
            "from ipycloud.cluster import checkpoint_dir\n"
            "print(checkpoint_dir('here'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (result.returncode, result.stdout) == (0, "here\n"), result.stderr


# -- the task file's YAML ------------------------------------------------------------------

AWKWARD = ["plain", "", " leading space", "trailing space ", 'say "hi"', "it's", "back\\slash",
           "a: b", "# not a comment", "- not a list", "{not: a map}", "tab\there",
           "new\nline", "é and 🐍", "line\u2028separator", "yes", "null", "0x1F", "~",
           "ends in newline\n", "two\nlines\n", "\nstarts with one\n", "ends in two\n\n"]


def test_the_yaml_reads_back_as_written_whatever_the_text() -> None:
    document = {"strings": {f"key {index} {text}": text for index, text in enumerate(AWKWARD)},
                "numbers": {"nodes": 3, "spot": True, "off": False},
                "script": "echo 'one'\n\n  indented: # kept\n"}
    text = to_yaml(document, comments=("a comment", "over\ntwo lines", "bell\x07 and \udcff"))
    assert yaml.safe_load(text) == document
    assert "\nscript: |\n  echo 'one'\n\n    indented: # kept\n" in text  # a readable block


# -- the command line ----------------------------------------------------------------------


def ipycloud_command(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipycloud", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_command_exports_a_script_with_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "my 'train' script.py"
    script.write_text("import torch\n")
    folder = tmp_path / 'the "task"'
    result = ipycloud_command("cluster", "export", "--folder", str(folder), "--bucket",
                              "r2://ckpt", "--nodes", "2", "--accelerators", "A100:8",
                              "--data", "/data=s3://my-data", "--spot", "--name", "run-1",
                              str(script), "--lr", "0.1", "--note", "it's \"quoted\"",
                              cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        f"wrote {folder}: task.yaml, requirements.txt, my 'train' script.py")
    assert launch_path(last_line(result.stdout)) == folder / "task.yaml"
    task = yaml.safe_load((folder / "task.yaml").read_text())
    assert (task["name"], task["num_nodes"]) == ("run-1", 2)
    assert shlex.split(task["run"].rsplit("\n  ", 1)[1]) == [
        "my 'train' script.py", "--lr", "0.1", "--note", "it's \"quoted\""]


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "0"], "ipycloud cluster export: --nodes must be a whole number of nodes, at "
                       "least 1, not 0\n"),
    (["--bucket", "ftp://x"], "ipycloud cluster export: --bucket: 'ftp://x' is not a bucket "
                              "SkyPilot mounts for checkpoints: give one of s3://, gs://, "
                              "r2://, https://<account>.blob.core.windows.net/<container>, "
                              "nebius://, cw://, vastdata://, hf://buckets/<namespace>/<name>\n"),
    (["--data", "/d=s3://a", "--data", "/d=s3://b"], "ipycloud cluster export: --data: a "
                                                     "mount path is given twice\n"),
    (["--data", "data=s3://a"], "ipycloud cluster export: --data: a mount path must be "
                                "absolute on the nodes, like '/data' or '~/data', not 'data'\n"),
])
def test_the_command_refuses_in_one_line_with_exit_status_1(args: list[str], message: str,
                                                            tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    result = ipycloud_command("cluster", "export", "--folder", "task", "--bucket", "s3://b",
                              *args, "train.py", cwd=tmp_path)
    assert (result.returncode, result.stderr, result.stdout) == (1, message, "")
    assert not (tmp_path / "task").exists()


def test_the_command_refuses_a_missing_script_and_usage_mistakes(tmp_path: Path) -> None:
    missing = ipycloud_command("cluster", "export", "--folder", "task", "--bucket", "s3://b",
                               "nowhere.py", cwd=tmp_path)
    assert (missing.returncode, missing.stderr) == (
        1, "ipycloud cluster export: no script 'nowhere.py': give the path of a Python file\n")
    for args, error in ((["--bucket", "s3://b", "train.py"], "the following arguments are "
                         "required: --folder"),
                        (["--folder", "t", "--bucket", "s3://b", "--data", "/d", "train.py"],
                         "argument --data: '/d' is not PATH=SOURCE, like /data=s3://my-data"),
                        (["--folder", "t", "--bucket", "s3://b"],  # ARGS may be left out
                         "the following arguments are required: SCRIPT")):
        usage = ipycloud_command("cluster", "export", *args, cwd=tmp_path)
        assert usage.returncode == 2
        assert usage.stderr.startswith("usage: ipycloud cluster export [-h]")
        assert usage.stderr.endswith(f"ipycloud cluster export: error: {error}\n")
    assert not (tmp_path / "task").exists() and not (tmp_path / "t").exists()


# -- SkyPilot's own reading of the task (scripts/test_cluster.sh) -------------------------


@needs_skypilot
@pytest.mark.parametrize("nodes", [1, 4])
@pytest.mark.parametrize("accelerators", [None, "A100:8"])
@pytest.mark.parametrize("with_data", [False, True])
@pytest.mark.parametrize("kind", ["function", "script"])
def test_skypilot_reads_every_task_as_meant(kind: str, nodes: int, accelerators: str | None,
                                            with_data: bool, tmp_path: Path) -> None:
    import sky
    from sky.data.storage import StorageMode

    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    local = tmp_path / "extra"
    local.mkdir()
    data = {"/data": "gs://my-data", "/extra": str(local)} if with_data else None
    train: Any = train_in_the_test if kind == "function" else script
    folder = tmp_path / "task"
    exported = export(train, folder=folder, bucket=BUCKET, nodes=nodes,
                      accelerators=accelerators, data=data, args=([1.0],) if kind == "function"
                      else ["--epochs", "3"])
    task = sky.Task.from_yaml(str(folder / "task.yaml"))
    assert task.num_nodes == nodes
    (resources,) = task.resources
    assert resources.accelerators == ({"A100": 8} if accelerators else None)
    assert resources.job_recovery == {"strategy": "EAGER_NEXT_REGION"}
    assert task.workdir == str(folder)
    checkpoints = task.storage_mounts[CHECKPOINT_MOUNT]
    assert (checkpoints.source, checkpoints.mode) == (BUCKET, StorageMode.MOUNT_CACHED)
    assert task.envs["IPYCLOUD_CHECKPOINT_DIR"] == CHECKPOINT_MOUNT
    if with_data:
        assert (task.storage_mounts["/data"].source,
                task.storage_mounts["/data"].mode) == ("gs://my-data", StorageMode.MOUNT)
        assert task.file_mounts == {"/extra": str(local)}
    else:
        assert set(task.storage_mounts) == {CHECKPOINT_MOUNT} and not task.file_mounts
    version = importlib.metadata.version("skypilot")
    assert last_line(str(exported)).startswith(f"SkyPilot {version} accepts the task: sky "
                                               "jobs launch ")


@needs_skypilot
def test_the_bucket_schemes_are_those_skypilot_mounts(tmp_path: Path) -> None:
    import sky
    from sky.data.storage import StoreType

    prefixes = {store.store_prefix() for store in StoreType if store is not StoreType.VOLUME}
    accepted = {"https://" if scheme == "https" else "hf://buckets/" if scheme == "hf"
                else f"{scheme}://" for scheme in DATA_SCHEMES}
    assert accepted == prefixes  # nothing SkyPilot mounts is refused, nothing else accepted
    assert set(DATA_SCHEMES) - set(CHECKPOINT_SCHEMES) == {"cos", "oci"}
    examples = {"https": "https://account.blob.core.windows.net/container/run",
                "hf": "hf://buckets/team/bucket/run", "cos": "cos://us-east/bucket/run"}
    urls = {scheme: examples.get(scheme, f"{scheme}://bucket/run") for scheme in DATA_SCHEMES}
    export(train_in_the_test, folder=tmp_path / "task", bucket=urls["gs"], args=([1.0],),
           data={f"/data/{scheme}": url for scheme, url in urls.items()})
    task = sky.Task.from_yaml(str(tmp_path / "task" / "task.yaml"))
    assert {path: mount.source for path, mount in task.storage_mounts.items()} == {
        CHECKPOINT_MOUNT: urls["gs"], **{f"/data/{scheme}": url for scheme, url in urls.items()}}
