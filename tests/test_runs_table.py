"""``ipycloud runs`` in a terminal writes its figures as people read them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_run_record_reading import RUN, T0, end, start, step, write_log

REPO = Path(__file__).resolve().parents[1]


def test_a_fast_run_shows_its_steps_per_second_without_an_exponent(tmp_path: Path) -> None:
    write_log(tmp_path, [start(pid=2**22 + 1), step(20, T0 + 1, steps_per_s=1560.4),
                         end("finished", 20)])
    shown = subprocess.run([sys.executable, "-m", "ipycloud", "runs", str(tmp_path)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert shown.returncode == 0, shown.stderr
    title, header, row = shown.stdout.splitlines()
    assert title == f"1 run in {tmp_path}" and row.split()[0] == RUN
    assert row[header.index("steps/s"):].split()[0] == "1560"
    assert "e+" not in row
