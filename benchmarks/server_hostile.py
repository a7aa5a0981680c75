"""Benchmark: the server extension's runs and history routes beside a hostile root folder.

Goal: 20 clients polling for 30 s get every answer (0 failed requests), p99 latency under
50 ms on each route.

A real ``jupyter server`` subprocess (tests/jupyter_process.py) with ipycloud's extension
serves a root folder that holds, beside ordinary runs: FIFOs in place of run logs and of
an entry of the user's index of runs (a reader that opens one waits forever), link loops
(a folder linked to its parent, a link to itself, a log linked to itself), a log and a
folder linked from outside the root, a log of damaged lines (a 100,000-deep JSON array, a
400-digit time and step, times of 1e300, Infinity and NaN, a NaN loss), and a live run
whose log holds BIG_LOG_LINES lines and grows by a step row every LIVE_STEP_S s. Midway
through the round a known log is swapped for a FIFO. Each client (runs_route.py's), about
once a second, asks ``runs``, ``runs/<live id>?since=<last t seen>`` (from the round's
start: a page following the live run, its past records already drawn; paging through all
10^6 records is another load, one lab page's, not 20's) and ``history?since=<last time
seen>``. A request fails when it is refused, reset, not
answered within 10 s, answered other than 200, or not strict JSON (NaN, Infinity). The
answers are checked too: no run of the hostile files but the damaged log's is listed.

Run: ``python benchmarks/server_hostile.py [--quick]`` (about 90 s, or 40); results go to
``benchmarks/results/server_hostile.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from figures import machine, write_results
from runs_route import (
    CLIENTS,
    GOAL_P99_MS,
    LIVE_ID,
    LIVE_STEP_S,
    QUICK_ROUND_S,
    ROUND_S,
    LiveRun,
    PollingClient,
    load_round,
    run_lines,
    step_line,
    write_log,
)

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from jupyter_process import JupyterProcess  # noqa: E402
from strict_json import HOSTILE_RECORD_LINES, loads  # noqa: E402
from waiting import wait_for  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "server_hostile.json"
BIG_LOG_LINES = 1_000_000
ROUTES = ("runs", "run", "history")
DAMAGED_ID, SWAPPED_ID = "da0000000001", "5a0000000001"
FIFO_IDS = ("f10000000001", "f10000000002")
LINKED_IDS = ("11000000000a", "11000000000b", "11000000000c")


class HostileClient(PollingClient):
    """A lab page following the live run and the machine's history."""

    history_since = 0.0
    decode = staticmethod(loads)

    def run(self) -> None:
        self.since = time.time()
        time.sleep(self.random.uniform(0, 1))
        while time.monotonic() < self.until:
            began = time.monotonic()
            self._ask("runs", "ipycloud/api/runs")
            answer = self._ask("run", f"ipycloud/api/runs/{LIVE_ID}?since={self.since!r}")
            if answer is not None and answer["records"]:
                self.since = answer["records"][-1]["t"]
            history = self._ask("history", f"ipycloud/api/history?since={self.history_since!r}")
            if history is not None and history["samples"]:
                self.history_since = history["samples"][-1]["time"]
            time.sleep(max(0.0, self.random.uniform(0.95, 1.05) - (time.monotonic() - began)))
        if self._connection is not None:
            self._connection.close()


def write_big_log(root: Path) -> Path:
    """The live run's log: BIG_LOG_LINES lines, written in blocks."""
    folder = root / "big" / "checkpoints"
    started = time.time() - BIG_LOG_LINES * 0.01
    log = write_log(folder, LIVE_ID, run_lines(LIVE_ID, folder, started, 0))
    with log.open("a") as file:
        for first in range(1, BIG_LOG_LINES, 100_000):
            file.write("".join(json.dumps(step_line(started + step * 0.01, step)) + "\n"
                               for step in range(first, min(first + 100_000, BIG_LOG_LINES))))
    return log


def make_hostile_root(root: Path, outside: Path, state: Path) -> dict[str, Path]:
    """The hostile tree; returns the logs the round changes."""
    now = time.time()
    logs = {"live": write_big_log(root)}
    ordinary = root / "ordinary" / "checkpoints"
    logs["swapped"] = write_log(ordinary, SWAPPED_ID, run_lines(SWAPPED_ID, ordinary, now, 50))
    damaged = root / "damaged" / "checkpoints"
    logs["damaged"] = write_log(damaged, DAMAGED_ID, run_lines(DAMAGED_ID, damaged, now, 3))
    with logs["damaged"].open("a") as file:
        file.write("".join(line + "\n" for line in HOSTILE_RECORD_LINES))
    fifos = root / "fifos" / "checkpoints" / ".ipycloud-runs"
    fifos.mkdir(parents=True)
    for run_id in FIFO_IDS:
        os.mkfifo(fifos / f"{run_id}.jsonl")
    index = state / "runs" / "index"
    index.mkdir(parents=True)
    os.mkfifo(index / f"{FIFO_IDS[0]}.json")
    (root / "loops").mkdir()
    (root / "loops" / "parent").symlink_to(root)
    (root / "loops" / "self").symlink_to(root / "loops" / "self")
    (root / "loops" / ".ipycloud-runs").mkdir()
    (root / "loops" / ".ipycloud-runs" / f"{LINKED_IDS[0]}.jsonl").symlink_to(
        root / "loops" / ".ipycloud-runs" / f"{LINKED_IDS[0]}.jsonl")
    secret = write_log(outside, LINKED_IDS[1], run_lines(LINKED_IDS[1], outside, now, 3))
    linked = root / "linked" / ".ipycloud-runs"
    linked.mkdir(parents=True)
    (linked / f"{LINKED_IDS[1]}.jsonl").symlink_to(secret)
    (root / "linked" / "outside").symlink_to(outside)
    (index / f"{LINKED_IDS[2]}.json").write_text(json.dumps({
        "run": LINKED_IDS[2], "log": str(linked / f"{LINKED_IDS[1]}.jsonl"), "kernel": None}))
    return logs


def listed_runs(server: JupyterProcess) -> int:
    """The runs the server lists; 0 while it reads the logs for the first time."""
    try:
        return len(server.api("ipycloud/api/runs")["runs"])
    except OSError:  # 503, or a timeout under load: the first view is being made
        return 0


def swap_for_fifo(log: Path) -> None:
    spare = log.with_name(log.name + ".fifo")
    os.mkfifo(spare)
    os.replace(spare, log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short round, for a check")
    round_s = QUICK_ROUND_S if parser.parse_args().quick else ROUND_S
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="server-hostile-") as temporary:
        folder = Path(temporary)
        root, home, state, outside = (folder / name for name in
                                      ("root", "home", "state", "outside"))
        for made in (root, home):
            made.mkdir()
        began = time.monotonic()
        logs = make_hostile_root(root, outside, state)
        made_s = time.monotonic() - began
        live = LiveRun(logs["live"])
        server = JupyterProcess(home, root, env={"IPYCLOUD_STATE_DIR": str(state)})
        try:
            server.wait_ready()
            began = time.monotonic()
            wait_for(lambda: listed_runs(server) == 3, 120, "the runs to be listed")
            first_view_s = time.monotonic() - began
            live.start()
            swap = threading.Timer(round_s / 2, swap_for_fifo, [logs["swapped"]])
            swap.start()
            figures = load_round(server, round_s, HostileClient, ROUTES)
            listed = sorted(run["id"] for run in server.api("ipycloud/api/runs")["runs"])
            swap.join()
        finally:
            live.stop.set()
            server.close()
    results = {
        "machine": {**machine(), "load_average_1min_at_start": round(load_before, 2)},
        "clients": CLIENTS, "round_s": round_s,
        "tree": {"big_log_lines": BIG_LOG_LINES, "live_step_s": LIVE_STEP_S,
                 "fifo_logs": len(FIFO_IDS), "fifo_index_entries": 1,
                 "link_loops": 3, "links_out_of_the_root": 2,
                 "damaged_lines": len(HOSTILE_RECORD_LINES),
                 "log_swapped_for_a_fifo_at_s": round_s / 2, "made_in_s": round(made_s, 1)},
        "first_view_s": round(first_view_s, 1),
        "listed_at_the_end": listed,
        **figures,
        "goals": {"failed": 0, "p99_ms": GOAL_P99_MS},
    }
    write_results(RESULTS, results)
    for route, row in figures["routes"].items():
        print(f"{route}: {row['requests']} requests, latency p50 {row['p50_ms']:.1f} ms, "
              f"p99 {row['p99_ms']:.1f} ms, max {row['max_ms']:.1f} ms")
    worst = max(row["p99_ms"] for row in figures["routes"].values())
    print(f"{CLIENTS} clients for {round_s:.0f} s beside the hostile tree: {figures['failed']} "
          f"failed (goal 0); worst p99 {worst:.1f} ms (goal < {GOAL_P99_MS:.0f}); listed at "
          f"the end: {listed}; the first view took {first_view_s:.1f} s; written to {RESULTS}")


if __name__ == "__main__":
    main()
