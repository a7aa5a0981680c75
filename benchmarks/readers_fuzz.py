"""Benchmark: the readers of files a user or another process can write, fuzzed, and the
memory of reading a long run log.

Goal: for each parser (a run record line, a whole run log summed up, an entry of the index
of runs, a checkpoint manifest, a folder lease, partial-download metadata, a failed-sync
record) at least INPUTS generated inputs, 0 uncaught exceptions, 0 hangs (an input read
for more than HANG_S); and the peak memory of reading and summarising a log of LOG_LINES
lines (and of a log holding one line of LONG_LINE_BYTES) bounded, whatever its length.

The inputs are mutations of sound files (bytes flipped, cut, repeated; a field given a
hostile value: NaN, Infinity, 1e400, a 400-digit number, a 100,000-deep array, invalid
UTF-8, a NUL, a lone surrogate, text of a megabyte) and random bytes, from a seeded
generator. Each is checked by the function the property tests use
(``tests/readers_inputs.py``): an exception other than its AssertionError or a failed
invariant counts as uncaught.

Run: ``python benchmarks/readers_fuzz.py`` (a few minutes); results go to
``benchmarks/results/readers_fuzz.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from figures import machine, write_results  # noqa: E402
from readers_inputs import (  # noqa: E402
    FAILED_SYNC,
    INDEX_ENTRY,
    LEASE,
    MANIFEST,
    PART_META,
    RECORD,
    check_failed_sync,
    check_index_entry,
    check_lease,
    check_log_lines,
    check_manifest,
    check_part_meta,
    check_record_line,
)

from ipycloud.runtime.runs.log_reader import LogReader  # noqa: E402
from ipycloud.runtime.runs.records import KINDS, RunRecordWarning  # noqa: E402

INPUTS = 100_000  # per parser
HANG_S = 5.0  # an input read for longer hangs
LOG_LINES = 1_000_000
LONG_LINE_BYTES = 100 << 20
SEED = 29
OUT = Path(__file__).parent / "results" / "readers_fuzz.json"

HOSTILE_VALUES: list[Any] = [
    float("nan"), float("inf"), float("-inf"), 1e300, -1e300, 10**400, -(10**400), 2**63,
    "\x00", "\ud800", [], {}, None, True, "", -1, 0.5, "step", "start",
]
HOSTILE_BYTES = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"9" * 400, b"{" * 40,
                 b"\x00", b"\xff\xfe", b'"\\ud800"', b"\n", b"\r", b'"', b"\\", b"}",
                 b"]", b"-", b"0" * 5000]
# Costly to read, so given now and then (BIG_SHARE of the mutations)
BIG_VALUES: list[Any] = ["x" * 100_000, json.loads("[" * 40 + "1" + "]" * 40)]
BIG_BYTES = [b"[" * 100_000, b"x" * (2 << 20)]
BIG_SHARE = 0.01


class Hang(Exception):
    """An input read for longer than HANG_S."""


def _alarm(signum: int, frame: object) -> None:
    raise Hang


def mutated_json(rng: random.Random, base: dict[str, Any]) -> bytes:
    """``base`` with a few fields given hostile or random values, as JSON text."""
    fields = dict(base)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice([*fields, "extra", ""]) if fields else "extra"
        value = rng.choice(BIG_VALUES if rng.random() < BIG_SHARE else HOSTILE_VALUES)
        if rng.random() < 0.3:
            value = {"nested": value, "list": [value] * rng.randint(0, 3)}
        fields[key] = value
    if rng.random() < 0.1:
        return json.dumps(rng.choice([[fields], "text", 5, None])).encode()
    return json.dumps(fields).encode()


def mutated_bytes(rng: random.Random, data: bytes) -> bytes:
    """``data`` with bytes flipped, cut, repeated, or hostile bytes spliced in."""
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        action = rng.randrange(5)
        at = rng.randint(0, len(mutated))
        if action == 0 and mutated:
            mutated[min(at, len(mutated) - 1)] = rng.randrange(256)
        elif action == 1:
            del mutated[at:at + rng.randint(1, 20)]
        elif action == 2:
            mutated[at:at] = rng.choice(BIG_BYTES if rng.random() < BIG_SHARE else HOSTILE_BYTES)
        elif action == 3:
            mutated = mutated[:at]
        else:
            mutated[at:at] = mutated[max(0, at - 30):at]
    return bytes(mutated)


def generate(rng: random.Random, base: dict[str, Any]) -> bytes:
    """One input: a mutated sound file, hostile JSON, or random bytes."""
    roll = rng.random()
    if roll < 0.45:
        return mutated_json(rng, base)
    if roll < 0.9:
        return mutated_bytes(rng, json.dumps(base).encode())
    return rng.randbytes(rng.randint(0, 200))


def record_line(rng: random.Random) -> bytes:
    return generate(rng, {**RECORD, "kind": rng.choice(KINDS)})


def log_lines(rng: random.Random) -> list[bytes]:
    sound = [json.dumps({**RECORD, "kind": "start", "step": 0}).encode()]
    sound += [json.dumps({**RECORD, "step": step, "t": RECORD["t"] + step}).encode()
              for step in range(1, rng.randint(1, 8))]
    return [line if rng.random() < 0.6 else record_line(rng) for line in sound] + [
        record_line(rng) for _ in range(rng.randint(0, 3))]


PARSERS: dict[str, tuple[Callable[[Any], None], Callable[[random.Random], Any]]] = {
    "run record line": (check_record_line, record_line),
    "run log summed up": (check_log_lines, log_lines),
    "index of runs entry": (check_index_entry, lambda rng: generate(rng, INDEX_ENTRY)),
    "checkpoint manifest": (check_manifest, lambda rng: generate(rng, MANIFEST)),
    "folder lease": (check_lease, lambda rng: generate(rng, LEASE)),
    "partial-download metadata": (check_part_meta, lambda rng: generate(rng, PART_META)),
    "failed-sync record": (check_failed_sync, lambda rng: generate(rng, FAILED_SYNC)),
}


def fuzz(name: str, inputs: int) -> dict[str, Any]:
    """``inputs`` generated inputs through one parser's check."""
    check, make = PARSERS[name]
    rng = random.Random(f"{SEED}-{name}")
    uncaught: Counter[str] = Counter()
    first: dict[str, str] = {}
    hangs = 0
    slowest = 0.0
    began = time.perf_counter()
    for _ in range(inputs):
        data = make(rng)
        signal.setitimer(signal.ITIMER_REAL, HANG_S)
        one = time.perf_counter()
        try:
            check(data)
        except Hang:
            hangs += 1
        except Exception as error:
            kind = f"{type(error).__name__}: {str(error)[:120]}"
            uncaught[kind] += 1
            first.setdefault(kind, repr(data)[:300])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        slowest = max(slowest, time.perf_counter() - one)
    return {"parser": name, "inputs": inputs, "uncaught_exceptions": sum(uncaught.values()),
            "hangs": hangs, "kinds_of_uncaught": dict(uncaught), "first_of_each": first,
            "slowest_input_ms": round(slowest * 1000, 2),
            "mean_input_us": round((time.perf_counter() - began) / inputs * 1e6, 1)}


def write_long_log(path: Path, lines: int) -> None:
    """A run's log of ``lines`` lines as ``fit`` writes them: a start, then step rows."""
    with open(path, "wb") as file:
        file.write(json.dumps({"t": 1_700_000_000.0, "kind": "start", "step": 0, "epoch": 0,
                               "total_steps": lines, "epochs": 10, "pid": 1, "host": "node-b",
                               "watch": {"metric": "val_loss", "mode": "min"}}).encode() + b"\n")
        batch = []
        for step in range(1, lines):
            batch.append(b'{"t":%.3f,"kind":"step","step":%d,"epoch":%d,"loss":%.6f,'
                         b'"lr":0.001,"steps_per_s":70000.0,"samples_per_s":4480000.0}\n'
                         % (1_700_000_000 + step / 70_000, step, step * 10 // lines,
                            1 / step))
            if len(batch) == 10_000:
                file.write(b"".join(batch))
                batch.clear()
        file.write(b"".join(batch))


def read_and_summarise(path: Path) -> dict[str, Any]:
    """What reading and summing up the log at ``path`` costs this process: its peak RSS
    (VmHWM) and the seconds; and what the summary keeps."""
    began = time.perf_counter()
    reader = LogReader(path)
    reader.read()
    summary = reader.summary()
    return {"step": summary.step, "step_rows_kept": len(summary.steps),
            "records_kept": len(reader.records()),
            "read_and_summary_s": round(time.perf_counter() - began, 2),
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident memory (MiB), from /proc (getrusage's survives exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def peak_memory(path: Path) -> dict[str, Any]:
    """``read_and_summarise`` in a process of its own, beside the peak RSS of a process
    that only imports the reader."""
    code = ("import json, sys, warnings\n"
            "warnings.simplefilter('ignore')\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from readers_fuzz import peak_rss_mb, read_and_summarise\n"
            "from pathlib import Path\n"
            "print(json.dumps(read_and_summarise(Path(sys.argv[2])) if len(sys.argv) > 2\n"
            "                 else {'peak_rss_mb': peak_rss_mb()}))\n")
    words = [sys.executable, "-c", code, str(Path(__file__).parent)]
    measured = [json.loads(subprocess.run(words + extra, check=True, capture_output=True,
                                          text=True).stdout)
                for extra in ([str(path)], [])]
    return {"file_mb": round(path.stat().st_size / 2**20, 1), **measured[0],
            "peak_rss_import_only_mb": measured[1]["peak_rss_mb"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=INPUTS, help="inputs per parser")
    parser.add_argument("--lines", type=int, default=LOG_LINES, help="lines of the long log")
    args = parser.parse_args()
    warnings.simplefilter("ignore", RunRecordWarning)
    signal.signal(signal.SIGALRM, _alarm)
    results = []
    for name in PARSERS:
        result = fuzz(name, args.inputs)
        results.append(result)
        print(f"{name}: {result['inputs']:,} inputs, {result['uncaught_exceptions']} uncaught, "
              f"{result['hangs']} hangs, slowest {result['slowest_input_ms']} ms", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "a1b2c3d4e5f6.jsonl"
        write_long_log(log, args.lines)
        long_log = peak_memory(log)
        print(f"{args.lines:,}-line log: {long_log}", flush=True)
        with open(log, "wb") as file:
            file.write(b'{"t":1700000000,"kind":"start","step":0,"epoch":0}\n'
                       b'{"t":1700000001,"kind":"event","message":"')
            for _ in range(LONG_LINE_BYTES >> 20):
                file.write(b"x" * (1 << 20))
            file.write(b'"}\n{"t":1700000002,"kind":"step","step":1}\n')
        long_line = peak_memory(log)
        print(f"a line of {LONG_LINE_BYTES >> 20} MB: {long_line}", flush=True)
    write_results(OUT, {
        "goal": f">= {INPUTS:,} inputs per parser, 0 uncaught exceptions, 0 hangs "
                f"(> {HANG_S:g} s); bounded memory for a {LOG_LINES:,}-line log",
        "parsers": results, "long_log": {"lines": args.lines, **long_log},
        "long_line": {"bytes": LONG_LINE_BYTES, **long_line},
        "machine": machine()})


if __name__ == "__main__":
    main()
