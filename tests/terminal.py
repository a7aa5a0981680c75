"""Run lines in a real terminal IPython (``python -m IPython``) in a fresh process."""

from __future__ import annotations

import subprocess
import sys

# Run before IPython starts: make packages unimportable, as if they were not installed.
_HIDE = "import sys\nfor name in {hidden!r}:\n    sys.modules[name] = None\n"


def terminal_ipython(lines: list[str], hidden: tuple[str, ...] = (),
                     cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Type ``lines`` into a terminal IPython with ``hidden`` packages missing."""
    code = (_HIDE.format(hidden=hidden) + "from IPython import start_ipython\n"
            "start_ipython(argv=['--no-banner', '--colors=NoColor', '--no-confirm-exit', "
            "'--HistoryManager.hist_file=:memory:'])\n")
    return subprocess.run([sys.executable, "-c", code], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=120, cwd=cwd)
