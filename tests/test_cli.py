"""The ``ipycloud`` command, run as a user would."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ipycloud import __version__


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipycloud", *args],
                          capture_output=True, text=True, timeout=120)


def test_info_prints_the_report() -> None:
    result = run("info")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Platform")
    assert "No NVIDIA GPU" in result.stdout
    assert f"{os.cpu_count()} logical" in result.stdout


def test_info_json_parses_and_matches_the_machine() -> None:
    result = run("info", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["host"]["cpu_logical"] == os.cpu_count()
    assert data["gpus"]["devices"] == []
    assert data["software"]["python"] == sys.version.split()[0]
    assert data["disks"][0]["path"] == os.getcwd()


def test_console_script_runs_demo() -> None:
    script = Path(sys.executable).with_name("ipycloud")
    result = subprocess.run([str(script), "demo"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"ipycloud {__version__}" in result.stdout
    assert "Platform" in result.stdout and "%load_ext ipycloud" in result.stdout
    assert "- starting on cpu (no GPU visible, no torch_xla, no MPS)" in result.stdout
    assert "was killed with SIGKILL (exit status -9)" in result.stdout
    assert "- the same command again: resuming from step-0000000" in result.stdout
    assert "equal the uninterrupted run's, bit for bit: True" in result.stdout
    readings = re.search(r"background sampler took (\d+) readings over .*: CPU (\d+)% on "
                         r"average, (\d+)% at peak; RAM at most", result.stdout)
    assert readings is not None, result.stdout
    assert int(readings[1]) >= 5 and int(readings[3]) > 0  # the training runs were seen
    assert not list(Path(tempfile.gettempdir()).glob("ipycloud-demo-*"))  # cleaned up


def test_demo_without_torch_says_how_to_get_the_rest() -> None:
    code = "import sys; sys.modules['torch'] = None; from ipycloud.cli import main; main(['demo'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torch is not installed: pip install 'ipycloud[torch]'" in result.stdout


def test_version() -> None:
    assert run("--version").stdout.strip() == f"ipycloud {__version__}"


@pytest.mark.parametrize(
    ("args", "usage", "message"),
    [
        ((), "ipycloud", "the following arguments are required: COMMAND"),
        (("bogus",), "ipycloud", "argument COMMAND: invalid choice: 'bogus'"),
        (("info", "--nope"), "ipycloud info", "unrecognized arguments: --nope"),
        (("info", "--js"), "ipycloud info", "unrecognized arguments: --js"),
        (("info", "extra"), "ipycloud info", "unrecognized arguments: extra"),
        (("checkpoint",), "ipycloud checkpoint", "the following arguments are required: ACTION"),
        (("checkpoint", "list"), "ipycloud checkpoint list",
         "the following arguments are required: FOLDER"),
        (("checkpoint", "list", ".", "--jso"), "ipycloud checkpoint list",
         "unrecognized arguments: --jso"),
        (("sync", "a"), "ipycloud sync", "the following arguments are required: DST"),
        (("sync", "", "b"), "ipycloud sync", "argument SRC: empty path"),
        (("sync", "a", "b", "--dry"), "ipycloud sync", "unrecognized arguments: --dry"),
    ],
)
def test_bad_arguments_exit_2_with_the_commands_usage_and_one_error_line(args, usage,
                                                                        message) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"usage: {usage} [-h]")
    error_lines = [line for line in lines if "error:" in line]
    assert len(error_lines) == 1 and error_lines[0].startswith(f"{usage}: error: {message}")


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """The reader is gone before the first write: every write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "ipycloud", "info", "--json"],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_info_json_piped_into_head() -> None:
    command = f"{shlex.quote(sys.executable)} -m ipycloud info --json | head -1"
    for _ in range(3):
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                                timeout=120)
        assert (result.stdout, result.stderr) == ("{\n", "")


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    """A folder, named with spaces and quotes, with two checkpoints of a small model."""
    torch = pytest.importorskip("torch")
    from ipycloud.runtime.checkpoint import CheckpointManager

    folder = tmp_path / """my "best" run's checkpoints"""
    manager = CheckpointManager(folder)
    model = torch.nn.Linear(3, 2)
    manager.save({"model": model}, 10, metrics={"val_loss": 0.5})
    manager.save({"model": model}, 20, tag="final")
    return folder


def test_checkpoint_list_shows_the_magics_table(shell, checkpoints: Path) -> None:
    script = Path(sys.executable).with_name("ipycloud")  # the installed command
    result = subprocess.run([str(script), "checkpoint", "list", str(checkpoints)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    magic = shell.run_line_magic("checkpoint", f"list --dir {shlex.quote(str(checkpoints))}")
    assert result.stdout == f"{magic}\n"
    assert result.stdout.splitlines()[0] == f"2 checkpoints in {checkpoints}"
    assert "step-000000020-final (latest)" in result.stdout


def test_checkpoint_list_as_json(checkpoints: Path) -> None:
    result = run("checkpoint", "list", str(checkpoints), "--json")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert listing["directory"] == str(checkpoints)
    assert listing["latest"] == "step-000000020-final"
    described = [(entry["step"], entry["tag"], entry["status"])
                 for entry in listing["checkpoints"]]
    assert described == [(10, None, "complete"), (20, "final", "complete")]
    assert listing["checkpoints"][0]["metrics"] == {"val_loss": 0.5}


def test_checkpoint_list_of_a_missing_folder_exits_1_with_one_line(tmp_path: Path) -> None:
    result = run("checkpoint", "list", str(tmp_path / "none here"))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"ipycloud checkpoint list: no checkpoint folder at "
                             f"{tmp_path / 'none here'}\n")


def test_checkpoint_list_of_an_empty_folder_says_so(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # without it, listing says to install it (tested elsewhere)
    folder = tmp_path / "no runs 'yet'"
    folder.mkdir()
    result = run("checkpoint", "list", str(folder))
    assert (result.returncode, result.stdout, result.stderr) == (
        0, f"no checkpoints in {folder}\n", "")


@pytest.mark.parametrize("below", ["", "/runs"])
def test_checkpoint_list_of_a_file_says_it_is_one(tmp_path: Path, below: str) -> None:
    file = tmp_path / "notes 'v1'.txt"
    file.write_text("mine")
    result = run("checkpoint", "list", f"{file}{below}")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"ipycloud checkpoint list: {file} is a file, not a folder\n"


def test_sync_copies_what_changed_and_deletes_only_when_asked(tmp_path: Path) -> None:
    source, target = tmp_path / "my outputs", tmp_path / "kept 'safe'"
    (source / "logs").mkdir(parents=True)
    (source / "model.pt").write_bytes(b"weights")
    (source / "logs" / "a b.txt").write_text("step 1")
    first = run("sync", str(source), str(target))
    assert first.returncode == 0, first.stderr
    assert first.stdout == "2 copied, 0 updated, 0 deleted, 0 unchanged (13 B)\n"
    assert (target / "logs" / "a b.txt").read_text() == "step 1"
    again = run("sync", str(source), str(target))
    assert again.stdout == "0 copied, 0 updated, 0 deleted, 2 unchanged (0 B)\n"
    (source / "model.pt").unlink()
    (source / "new.txt").write_text("new")
    planned = run("sync", str(source), str(target), "--delete", "--dry-run")
    assert planned.stdout.splitlines()[:2] == ["would copy new.txt", "would delete model.pt"]
    assert planned.stdout.splitlines()[-1].startswith("dry run: 1 copied, 0 updated, 1 deleted")
    assert (target / "model.pt").exists() and not (target / "new.txt").exists()
    kept = run("sync", str(source), str(target), "--json")
    report = json.loads(kept.stdout)
    assert (report["copied"], report["deleted"], report["dry_run"]) == (["new.txt"], [], False)
    assert (target / "model.pt").exists()  # nothing deleted unless asked
    run("sync", str(source), str(target), "--delete")
    assert not (target / "model.pt").exists()


def test_sync_from_a_missing_folder_exits_1_with_one_line(tmp_path: Path) -> None:
    result = run("sync", str(tmp_path / "nothing"), str(tmp_path / "dst"))
    assert result.returncode == 1
    assert result.stderr == (f"ipycloud sync: sync source {str(tmp_path / 'nothing')!r} is not "
                             "an existing folder\n")
    assert not (tmp_path / "dst").exists()


def test_ctrl_c_ends_a_command_with_one_line() -> None:
    demo = subprocess.Popen([sys.executable, "-m", "ipycloud", "demo"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert demo.stdout is not None
    for line in demo.stdout:
        if line.startswith("Training with ipycloud.fit"):
            break
    demo.send_signal(signal.SIGINT)  # as Ctrl-C does, while the first run trains
    _, errors = demo.communicate(timeout=120)
    assert (demo.returncode, errors) == (130, "ipycloud demo: interrupted\n")
    assert not list(Path(tempfile.gettempdir()).glob("ipycloud-demo-*"))  # cleaned up
