"""The lab extension's unit tests (labextension/test/*.test.ts: run figures in words, the
charts' data) under node's test runner, as `jlpm test` runs them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

LABEXTENSION = Path(__file__).parent.parent / "labextension"


def test_the_lab_extension_unit_tests_pass() -> None:
    node = shutil.which("node")
    assert node is not None, "the lab extension's tests need node 20 (as its build does)"
    assert (LABEXTENSION / "node_modules").is_dir(), (
        "the lab extension's tests need its node_modules: cd labextension && jlpm install")
    result = subprocess.run([node, "node_modules/typescript/bin/tsc", "-p", "test"],
                            cwd=LABEXTENSION, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run([node, "test/run.mjs"], cwd=LABEXTENSION, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# fail 0" in result.stdout
