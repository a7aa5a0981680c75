"""``google.colab.runtime`` with the real signature of ``unassign``.

On Colab it disconnects the notebook from its machine and gives the machine back; here
``calls`` records each call, and the process goes on.
"""

from __future__ import annotations

calls: list[tuple[()]] = []


def unassign() -> None:
    """Give this runtime's machine back (here: record the call)."""
    calls.append(())
