"""``fit`` under elastic torchrun on two nodes: two torchrun agents on this machine, 2
workers each (world size 4), c10d rendezvous on 127.0.0.1, one checkpoint folder, real
SIGKILLs and SIGTERMs (``local_nodes``, ``elastic_training``)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from local_nodes import LocalNodes, wait_for

SCRIPT = Path(__file__).with_name("elastic_training.py")
SAMPLES = 256  # elastic_training.SAMPLES
EPOCHS, CHECKPOINT_EVERY = 3, 4
STEPS_AT_FOUR = EPOCHS * SAMPLES // (4 * 8)  # 8 samples per rank and step
START_S = 120  # four workers importing torch on two cores


def nodes(tmp: Path, pace: float, **options: Any) -> LocalNodes:
    (tmp / "out").mkdir(parents=True, exist_ok=True)
    return LocalNodes(SCRIPT, [str(tmp / "run"), str(tmp / "out"), str(EPOCHS),
                               str(CHECKPOINT_EVERY), str(pace)], tmp / "logs", **options)


def trained_rows(out: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for log in out.glob("trained-*.jsonl")
            for line in log.read_text().splitlines()]
    return sorted(rows, key=lambda row: row["t"])


def surviving(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """Each (step, rank) trained in the run that lasted: a process that starts at step s
    (a restarted group resuming) replaces what processes that had ended by then trained
    from step s on."""
    rows = trained_rows(out)
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    for row in rows:
        started.setdefault(row["pid"], row["t"])
        ended[row["pid"]] = row["t"]
    kept: dict[tuple[int, int], dict[str, Any]] = {}
    for row in rows:
        if row["t"] == started[row["pid"]]:
            for key in [key for key, old in kept.items()
                        if key[0] >= row["step"] and ended[old["pid"]] < row["t"]]:
                del kept[key]
        kept[(row["step"], row["rank"])] = row
    return kept


def assert_every_sample_once_an_epoch(out: Path) -> None:
    kept = surviving(out)
    steps = sorted({step for step, _ in kept})
    assert steps == list(range(1, steps[-1] + 1))  # no step missing, none twice
    for epoch in range(EPOCHS):
        ids = sorted(sample for row in kept.values() if row["epoch"] == epoch
                     for sample in row["ids"])
        assert ids == list(range(SAMPLES)), f"epoch {epoch}"


def record(folder: Path) -> list[dict[str, Any]]:
    (log,) = (folder / ".ipycloud-runs").glob("*.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt")


def assert_equal_weights(first: dict[str, torch.Tensor],
                         second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


def first_rank(out: Path) -> set[int]:
    return {row["pid"] for row in trained_rows(out) if row["rank"] == 0}


def past_a_checkpoint(tmp: Path) -> bool:
    """Whether the first checkpoint is written and the run two steps past it."""
    return (any((tmp / "run").glob("step-*.pt"))
            and any(row["step"] >= CHECKPOINT_EVERY + 2 for row in trained_rows(tmp / "out")))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """(a) A run at world size 4 that nothing interrupts: its folder."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    with nodes(tmp, pace=0.0) as cluster:
        assert cluster.wait() == [0, 0], cluster.tail()
    return tmp


def test_an_uninterrupted_run_on_two_nodes_trains_every_sample_once_an_epoch(
        uninterrupted: Path) -> None:
    out, folder = uninterrupted / "out", uninterrupted / "run"
    assert_every_sample_once_an_epoch(out)
    assert {row["world"] for row in trained_rows(out)} == {4}
    lines = record(folder)
    (start,) = [line for line in lines if line["kind"] == "start"]
    assert {start["pid"]} == first_rank(out)  # the first rank alone writes the record
    assert lines[-1]["kind"] == "end" and lines[-1]["status"] == "finished"
    assert lines[-1]["step"] == STEPS_AT_FOUR
    saved = [line["step"] for line in lines if line["kind"] == "checkpoint"]
    assert saved == sorted(set(saved))  # one writer: no step saved twice


def test_a_worker_killed_mid_epoch_is_restarted_and_ends_bit_exact(
        tmp_path: Path, uninterrupted: Path) -> None:
    """(b) The agents restart the group, fit resumes from the newest checkpoint, and the
    weights equal the uninterrupted run's bit for bit at world size 4."""
    with nodes(tmp_path, pace=0.1) as cluster:
        wait_for(lambda: past_a_checkpoint(tmp_path), START_S,
                 "steps past the first checkpoint", cluster)
        cluster.workers(1)[0].kill()
        assert cluster.wait() == [0, 0], cluster.tail()
    resumed = [line for line in record(tmp_path / "run") if line.get("event") == "resume"]
    assert len(resumed) == 1
    assert_every_sample_once_an_epoch(tmp_path / "out")
    assert_equal_weights(final_weights(tmp_path / "out"),
                         final_weights(uninterrupted / "out"))


def test_a_save_in_flight_when_a_peer_dies_is_written_before_the_first_rank_ends(
        tmp_path: Path) -> None:
    """The first save is still being written (in the background) when a worker is
    killed: the first rank's collective fails, torchrun sends it SIGTERM at once, and
    the signal waits until the save is written and the end told."""
    with nodes(tmp_path, pace=0.1, environment={"ELASTIC_BALLAST_MB": "200"}) as cluster:
        # A rank past the first checkpoint's step: the first rank has begun to save it.
        wait_for(lambda: any(row["step"] > CHECKPOINT_EVERY
                             for row in trained_rows(tmp_path / "out")), START_S,
                 "a step past the first checkpoint's", cluster)
        cluster.workers(1)[0].kill()
        assert cluster.wait() == [0, 0], cluster.tail()
    lines = record(tmp_path / "run")
    ends = [line for line in lines if line["kind"] == "end"]
    assert [end["status"] for end in ends] == ["failed", "finished"]
    (resumed,) = [line for line in lines if line.get("event") == "resume"]
    assert f"(step {CHECKPOINT_EVERY}," in resumed["message"] or \
        f"(step {2 * CHECKPOINT_EVERY}," in resumed["message"]
    assert_every_sample_once_an_epoch(tmp_path / "out")


def test_a_node_lost_for_good_leaves_the_run_at_world_size_two(tmp_path: Path) -> None:
    """(c) With --nnodes=1:2, one agent and its workers killed for good: the other agent
    re-forms the group alone and the run ends at world size 2, each sample trained once
    an epoch (the data split again at the checkpoint it resumed from, mid-epoch)."""
    with nodes(tmp_path, pace=0.1, nnodes="1:2") as cluster:
        wait_for(lambda: past_a_checkpoint(tmp_path), START_S,
                 "steps past the first checkpoint", cluster)
        cluster.kill_node(1)
        assert cluster.wait()[0] == 0, cluster.tail()
    worlds = [row["world"] for row in surviving(tmp_path / "out").values()]
    assert worlds[0] == 4 and worlds[-1] == 2
    assert_every_sample_once_an_epoch(tmp_path / "out")
    assert record(tmp_path / "run")[-1]["status"] == "finished"


def test_sigterm_to_one_node_saves_the_step_where_every_rank_stops(tmp_path: Path) -> None:
    """(d) SIGTERM reaches the workers of one node only (its machine is preempted): every
    rank stops at the same step, the first rank saves it, and the node that stays goes on
    alone from that very step."""
    with nodes(tmp_path, pace=0.1, nnodes="1:2") as cluster:
        wait_for(lambda: past_a_checkpoint(tmp_path), START_S,
                 "steps past the first checkpoint", cluster)
        cluster.signal_node(1, signal.SIGTERM)
        codes = cluster.wait()
    assert codes[0] == 0 and codes[1] != 0, cluster.tail()
    lines = record(tmp_path / "run")
    (stopped,) = [line for line in lines if line.get("event") == "sigterm"]
    paused = next(line for line in lines if line["kind"] == "end")
    assert paused["status"] == "paused"
    saved = [line["step"] for line in lines if line["kind"] == "checkpoint"]
    (resumed,) = [line for line in lines if line.get("event") == "resume"]
    assert f"(step {paused['step']}," in resumed["message"]  # nothing lost
    assert paused["step"] in saved and f"step {paused['step']}" in stopped["message"]
    assert_every_sample_once_an_epoch(tmp_path / "out")


def test_sigterm_to_every_node_saves_and_the_rerun_ends_bit_exact(
        tmp_path: Path, uninterrupted: Path) -> None:
    """(d) The whole cluster goes away: every rank stops at one step, the first rank saves
    it within the agents' grace period, and starting the job again finishes it exactly."""
    with nodes(tmp_path, pace=0.1) as cluster:
        wait_for(lambda: past_a_checkpoint(tmp_path), START_S,
                 "steps past the first checkpoint", cluster)
        for node in (0, 1):
            cluster.signal_node(node, signal.SIGTERM)
        codes = cluster.wait()
    assert 0 not in codes, cluster.tail()
    lines = record(tmp_path / "run")
    assert lines[-1]["kind"] == "end" and lines[-1]["status"] == "paused"
    stop = lines[-1]["step"]
    assert [line for line in lines if line["kind"] == "checkpoint"][-1]["step"] == stop
    assert not (tmp_path / "out" / "final.pt").exists()
    with nodes(tmp_path, pace=0.0) as cluster:
        assert cluster.wait() == [0, 0], cluster.tail()
    assert_every_sample_once_an_epoch(tmp_path / "out")
    assert_equal_weights(final_weights(tmp_path / "out"),
                         final_weights(uninterrupted / "out"))
