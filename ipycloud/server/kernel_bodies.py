"""The JSON bodies of the kernel routes and the death events (schema/*.json gives their shapes);
those of ``reading`` and ``history`` are the runtime's (ipycloud.runtime.monitor.route_bodies), as
the kernel's dashboard page answers them too. Sizes are bytes, times Unix seconds,
percentages 0-100; a figure the machine cannot give is None (null), never left out."""

from __future__ import annotations

from ipycloud.runtime.monitor.deaths import Death, signal_name
from ipycloud.runtime.monitor.processes import ProcessTree
from ipycloud.runtime.monitor.route_bodies import Json
from ipycloud.runtime.units import format_in, size_unit


def kernel(kernel_id: str, name: str | None, execution_state: str | None,
           session: Json | None, pid: int | None, problem: str | None,
           tree: ProcessTree | None) -> Json:
    """One entry of ``kernels``: ``session`` is the session manager's model of the kernel's
    session, ``tree`` its process tree at the latest reading (None before one saw it)."""
    alive = tree if tree is not None and tree.alive else None
    return {
        "id": kernel_id,
        "name": name,
        "path": None if session is None else session.get("path"),
        "type": None if session is None else session.get("type"),
        "execution_state": execution_state,
        "pid": pid,
        "problem": problem,
        "processes": None if alive is None else len(alive.pids),
        "rss": None if alive is None else alive.rss,
        "cpu_percent": None if alive is None else alive.cpu_percent,
        "gpu_memory": [{"gpu": share.gpu, "used": share.used}
                       for share in (alive.gpu_memory if alive is not None else ())],
    }


def death_message(who: str, death: Death, returncode: int | None) -> str:
    """The event's line: ``the kernel of train.ipynb was killed: out of memory (limit 12.7
    GiB, peak 12.6 GiB)``, the limit and the peak in one unit (``limit 1024 MiB, peak
    900 MiB``); ``who`` names the kernel (``the kernel of train.ipynb``)."""
    if death.out_of_memory:
        known = [(label, value) for label, value in
                 (("limit", death.ram_limit), ("peak", death.ram_peak)) if value is not None]
        unit = size_unit(max((value for _, value in known), default=0))
        figures = [f"{label} {format_in(value, unit)}" for label, value in known]
        return f"{who} was killed: out of memory" + (f" ({', '.join(figures)})" if figures
                                                     else "")
    if returncode is None:
        return f"{who} died"
    if returncode < 0:
        name = signal_name(-returncode)
        return f"{who} was killed by signal {-returncode}" + (f" ({name})" if name else "")
    return f"{who} exited with code {returncode}"

