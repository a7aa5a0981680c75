"""Fuzzing the parsers of what users write: durations, sizes, the magics' duration lists
and lines, the guard's settings, alert URLs, notify.json, kaggle.json and price files
(tests/user_text_parsers.py lists them). Each gets --count generated inputs: mutations of
valid samples, runs of the words the parser gives meaning to, random text or bytes, JSON
documents, nesting 1 to 100,000 deep and numbers of up to 10,000 digits.

An input's outcome is a value or the parser's own one-line refusal; anything else raised
is counted as uncaught (with a few examples), and a call that takes more than HANG_S
seconds is stopped and counted as a hang. Writes benchmarks/results/parsers_fuzz.json.

    PYTHONPATH=. python benchmarks/parsers_fuzz.py [--count 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from user_text_parsers import (  # noqa: E402
    VALID_SAMPLES,
    Parser,
    magic_lines,
    outcome,
    parsers,
)

RESULTS = HERE / "results" / "parsers_fuzz.json"
HANG_S = 2.0
SEED = 29
EXAMPLES = 3  # uncaught exceptions kept per parser, as examples

WORDS = ["--dir", "--every", "--tag", "--json", "--interval", "--limit", "--warn", "-p",
         "-h", "--", "-", "=", "'", '"', "\\", " ", "\t", "\n", "save", "list", "start",
         "stop", "add", "remove", "test", "sync", "report", "model", "5m", "1h30m", "-5m",
         "90", "2d", "ntfy://", "json://", "tgram://", "mailto://", "127.0.0.1", "ntfy.sh",
         ":", "/", "//", "?", "&", "#", "@", "%", "%zz", "~", "~nobody", "$HOME", ",", ";",
         "nan", "inf", "-inf", "1e400", "9" * 40, "0", ".", "..", "d", "s", "h", "m", "GiB",
         "KB", "\x00", "\x1b", "\udcff", "\u2028", "é", "🐍", "١٢"]
FIELDS = ["urls", "username", "key", "instances", "currency", "gpu", "gpus", "usd_per_hour",
          "units_per_hour", "usd_per_unit", "source", "as_of", "verified", "note",
          "aws:g5.xlarge", "colab:t4"]


class Hang(BaseException):
    """A call that ran past HANG_S (not an Exception, so that no parser's own `except
    Exception` takes it for a refusal)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang


class Inputs:
    """Generated inputs for one parser, from a seeded random source."""

    def __init__(self, parser: Parser, rng: random.Random) -> None:
        self.parser = parser
        self.rng = rng
        self.samples = VALID_SAMPLES[parser.name]

    def next(self) -> str | bytes:
        makers = ([self._words, self._mutated, self._random_text] if self.parser.takes == "text"
                  else [self._json_document, self._mutated, self._random_bytes, self._deep,
                        self._long_number])
        return self.rng.choice(makers)()

    def _words(self) -> str:
        return "".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(0, 12)))

    def _random_text(self) -> str:
        return "".join(chr(self.rng.choice([self.rng.randint(0, 127),
                                            self.rng.randint(0, 0x10FFFF)]))
                       for _ in range(self.rng.randint(0, 40)))

    def _random_bytes(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, 300))

    def _mutated(self) -> str | bytes:
        sample = self.rng.choice(self.samples)
        data = bytearray(sample.encode("utf-8", "surrogatepass") if isinstance(sample, str)
                         else sample)
        for _ in range(self.rng.randint(1, 4)):
            at = self.rng.randint(0, len(data))
            action = self.rng.randrange(3)
            if action == 0 and data:
                del data[at:at + self.rng.randint(1, 4)]
            elif action == 1:
                data[at:at] = self.rng.choice(WORDS).encode("utf-8", "surrogatepass")
            elif data:
                data[min(at, len(data) - 1)] = self.rng.randrange(256)
        raw = bytes(data)
        return raw.decode("utf-8", "surrogateescape") if isinstance(sample, str) else raw

    def _json_value(self, depth: int) -> Any:
        kind = self.rng.randrange(9 if depth < 4 else 6)
        if kind == 0:
            return None
        if kind == 1:
            return self.rng.choice([True, False])
        if kind == 2:
            return self.rng.choice([0, -1, 2**63, 10**30, self.rng.randint(-1000, 1000)])
        if kind == 3:
            return self.rng.choice([0.5, -1.0, 1e308, float("nan"), float("inf")])
        if kind in (4, 5):
            return self.rng.choice([self._words(), self.rng.choice(FIELDS), "2026-01", "T4"])
        if kind in (6, 7):
            return {self.rng.choice([*FIELDS, self._words()]): self._json_value(depth + 1)
                    for _ in range(self.rng.randint(0, 6))}
        return [self._json_value(depth + 1) for _ in range(self.rng.randint(0, 4))]

    def _json_document(self) -> bytes:
        return json.dumps(self._json_value(0)).encode("utf-8", "surrogatepass")

    def _deep(self) -> bytes:
        depth = self.rng.choice([10, 100, 1000, 10_000, 100_000])
        opening, closing = self.rng.choice([(b"[", b"]"), (b'{"urls":', b"}")])
        return opening * depth + b"1" + closing * depth

    def _long_number(self) -> bytes:
        digits = b"9" * self.rng.choice([20, 400, 4301, 10_000])
        field = self.rng.choice(["gpus", "usd_per_hour", "urls", "key"]).encode()
        return b'{"' + field + b'": ' + digits + b"}"


def fuzz(parser: Parser, count: int, rng: random.Random) -> dict[str, Any]:
    """Run ``parser`` on ``count`` generated inputs; its counts."""
    inputs = Inputs(parser, rng)
    for sample in inputs.samples:  # untimed: what a first call imports (Apprise loads a
        outcome(parser, sample)  # service's plugin on its first URL) is no work on the input
    outcomes: Counter[str] = Counter()
    uncaught: Counter[str] = Counter()
    examples: list[str] = []
    slowest = 0.0
    started = time.perf_counter()
    for _ in range(count):
        value = inputs.next()
        began = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, HANG_S)
        try:
            outcomes[outcome(parser, value)] += 1
        except Hang:
            outcomes["hang"] += 1
            examples.append(f"hang: {value!r:.200}")
        except BaseException as error:  # what the parser let escape: the finding
            if isinstance(error, KeyboardInterrupt):
                raise
            outcomes["uncaught"] += 1
            uncaught[type(error).__name__] += 1
            if len(examples) < EXAMPLES:
                examples.append(f"{type(error).__name__}: {str(error)[:200]} <- {value!r:.200}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        slowest = max(slowest, time.perf_counter() - began)
    return {"inputs": count, "ok": outcomes["ok"], "refused": outcomes["refused"],
            "uncaught": outcomes["uncaught"], "uncaught_by_type": dict(uncaught),
            "hangs": outcomes["hang"], "examples": examples,
            "slowest_call_s": round(slowest, 4),
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--count", type=int, default=100_000, help="inputs per parser")
    options.add_argument("--only", action="append", help="fuzz only this parser (repeatable)")
    options.add_argument("--out", type=Path, default=RESULTS)
    args = options.parse_args()
    os.environ.setdefault("IPYCLOUD_CONFIG_DIR", "/nonexistent/ipycloud-fuzz")
    signal.signal(signal.SIGALRM, _on_alarm)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    report: dict[str, Any] = {"parsers": {}}
    for parser in parsers(magic_lines()):
        if args.only and parser.name not in args.only:
            continue
        result = fuzz(parser, args.count, random.Random(f"{SEED}:{parser.name}"))
        print(f"{parser.name}: {json.dumps(result)}", flush=True)
        report = _recorded(args.out, parser.name, result)
    print(f"wrote {args.out}: {report.get('total')}")
    return 1 if report.get("total", {}).get("uncaught") or report.get("total", {}).get(
        "hangs") else 0


def _recorded(out: Path, name: str, result: dict[str, Any]) -> dict[str, Any]:
    """The results file with ``result`` for parser ``name`` put in (those of the other
    parsers kept, so that parsers may be fuzzed in separate runs); the report written."""
    try:
        report = json.loads(out.read_text())
    except (OSError, ValueError):
        report = {}
    results = {**report.get("parsers", {}), name: result}
    report = {"benchmark": "parsers_fuzz", "seed": SEED, "hang_s": HANG_S,
              "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "parsers": results,
              "total": {"parsers": len(results),
                        "inputs": sum(r["inputs"] for r in results.values()),
                        "uncaught": sum(r["uncaught"] for r in results.values()),
                        "hangs": sum(r["hangs"] for r in results.values())}}
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.{os.getpid()}")
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    temporary.replace(out)
    return report


if __name__ == "__main__":
    sys.exit(main())
