"""The run record of real processes: one killed outright (SIGKILL) keeps all but its last
instant and reads as lost; its rerun continues the same record; a SIGTERM ends it paused.

Each run is a fresh interpreter: tests/recorded_training.py, which prints each step row
its record is told, and tests/preempted_training.py, which sends itself SIGTERM.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipycloud.runtime.runs import read_run, runs
from ipycloud.runtime.runs.records import RECORD_FOLDER, read_records

HERE = Path(__file__).parent
TIMEOUT_S = 300
KILL_AFTER_STEP = 10
SINCE_S = 1.0  # a row logged this long before the kill is in the record


def start_training(folder: Path, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HERE / "recorded_training.py"), str(folder),
                             *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def lines_until(process: subprocess.Popen[str], wanted: str) -> list[str]:
    """The lines ``process`` prints up to ``wanted``."""
    assert process.stdout is not None
    lines = []
    while (line := process.stdout.readline()) and line.strip() != wanted:
        lines.append(line.strip())
    assert line, f"the process ended before saying {wanted!r}: {process.communicate()}"
    return [*lines, wanted]


def the_log(folder: Path) -> Path:
    [log] = (folder / RECORD_FOLDER).glob("*.jsonl")
    return log


def test_a_killed_run_keeps_its_record_up_to_its_last_second_and_its_rerun_continues_it(
        tmp_path: Path) -> None:
    folder = tmp_path / "run 'one'"
    process = start_training(folder, "--item-delay", "0.004")
    said = lines_until(process, f"logged {KILL_AFTER_STEP}")
    time.sleep(SINCE_S)  # every row said so far was logged at least this long ago
    process.kill()
    said += process.communicate(timeout=TIMEOUT_S)[0].split("\n")
    logged = [int(line.split()[1]) for line in said if line.startswith("logged ")]

    log = the_log(folder)
    steps = [line["step"] for line in read_records(log) if line["kind"] == "step"]
    assert steps == logged[:len(steps)]  # what the process logged, in order
    assert steps[-1] >= KILL_AFTER_STEP
    [run] = runs(folder)
    assert (run.status, run.id, run.step) == ("lost", log.stem, steps[-1])
    manifest = json.loads(sorted(folder.glob("step-*.json"))[-1].read_text())
    assert manifest["run"] == run.id  # the record is the checkpoints' run

    rerun = start_training(folder)
    _, err = rerun.communicate(timeout=TIMEOUT_S)
    assert rerun.returncode == 0, err
    assert the_log(folder) == log  # the same record, continued
    run, lines = read_run(log)
    starts = [line for line in lines if line["kind"] == "start"]
    assert [start["step"] for start in starts] == [0, manifest["step"]]
    assert [event["event"] for event in run.events] == ["resume"]
    assert (run.status, run.step, run.total_steps) == ("finished", 96, 96)
    resumed_at = manifest["step"]  # rows the kill lost up to there are not redone
    assert [row["step"] for row in run.steps] == [  # and redone rows are there once
        *range(1, min(steps[-1], resumed_at) + 1), *range(resumed_at + 1, 97)]


@pytest.mark.parametrize("when", ["step:7", "validation:1"],
                         ids=["between steps", "in the signal's handler"])
def test_a_sigterm_ends_the_record_paused(tmp_path: Path, when: str) -> None:
    folder = tmp_path / "run"
    process = subprocess.run([sys.executable, str(HERE / "preempted_training.py"), str(folder),
                              str(tmp_path / "out.pt"), "--sigterm", when],
                             capture_output=True, text=True, timeout=TIMEOUT_S)
    assert process.returncode == -signal.SIGTERM, process.stderr

    [run] = runs(folder)
    assert run.status == "paused"
    assert run.reason is not None and "rerun this cell to continue" in run.reason
    assert [event["event"] for event in run.events] == ["sigterm"]
    assert run.checkpoints[-1]["step"] == run.step
