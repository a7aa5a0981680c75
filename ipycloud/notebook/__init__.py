"""What ``fit`` shows in a notebook beside its progress bar, and what the runtime learns
from the notebook's cells, with nothing but IPython.

``import ipycloud`` attaches it to the runtime (``attach``): the live curves of every run,
however ``fit`` is imported afterwards (the curves module itself loads only when a run in a
Jupyter kernel asks for curves), and the cell that first initialised CUDA. In a terminal or
a script it shows nothing.
"""

from __future__ import annotations

from ipycloud.runtime.train.callback import Callback, RunStart, register_front


def live_curves(start: RunStart) -> Callback | None:
    """The callback that draws ``start``'s run in this notebook, or None where it must not
    (see ``curves.live_curves``)."""
    if not start.curves:
        return None
    from ipycloud.notebook import curves

    return curves.live_curves(start)


def follow_runs() -> None:
    """Draw the live curves of every later run of ``fit`` in this notebook."""
    register_front(live_curves)


def attach() -> None:
    """Follow every later run, and note the cell that first initialises CUDA."""
    from ipycloud.notebook.cuda_cell import watch_cuda_start

    follow_runs()
    watch_cuda_start()


__all__ = ["attach", "follow_runs", "live_curves"]
