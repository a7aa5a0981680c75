"""Runs one page's examples, given as JSON on stdin ([[line, code], ...]), one after the
other in one real IPython shell, so magics (%load_ext ipycloud, %gpuinfo) work as in a
notebook. Exits 1 at the first block that fails, naming its line."""

from __future__ import annotations

import json
import sys

from IPython.core.interactiveshell import InteractiveShell


def main() -> int:
    shell = InteractiveShell.instance()
    for line, code in json.load(sys.stdin):
        print(f"--- the block at line {line}", flush=True)
        result = shell.run_cell(code, store_history=True)
        if not result.success:
            print(f"FAILED: the block at line {line}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
