"""Why a watched process (a kernel) ended, from its exit status and the host samples taken
before it: out of memory, a signal, or an exit code.

Out of memory is said when the cgroup's OOM-kill counter rose since the last sample that
saw the process alive, or when the process was SIGKILLed while RAM was within
``OOM_MARGIN`` of its limit (an OOM killer outside the cgroup's counters: the host's, or a
platform's watchdog). The RAM peak before the death is the highest use sampled since then,
or the cgroup's own peak counter when that rose meanwhile (it sees spikes between samples).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

from ipycloud.runtime.monitor.host import HostSample

OOM_MARGIN = 0.05  # a SIGKILL with RAM this close to its limit (a fraction) is out of memory
RECENT_S = 10.0  # without a sample that saw the process alive: the samples this recent


@dataclass(frozen=True, slots=True)
class Death:
    """What is known about a process's end."""

    reason: str | None  # "out of memory", "killed by signal 9", "exited with code 1"; None
    out_of_memory: bool
    ram_limit: int | None  # bytes
    ram_peak: int | None  # bytes, the highest use seen before the death


def before_death(history: Sequence[HostSample], key: str, pid: int | None,
                 now: float) -> list[HostSample]:
    """The samples from the last one in which the tree watched as ``key`` with root ``pid``
    was alive, up to now; without such a sample, those of the last RECENT_S seconds."""
    for position in range(len(history) - 1, -1, -1) if pid is not None else ():
        tree = history[position].watched.get(key)
        if tree is not None and tree.pid == pid and tree.alive:
            return list(history[position:])
    return [sample for sample in history if sample.time >= now - RECENT_S]


def explain_death(returncode: int | None, samples: Sequence[HostSample],
                  oom_kills_now: int | None, ram_peak_now: int | None) -> Death:
    """The reason of a death from the exit status (``Popen.returncode``: negative for a
    signal, None when unknown), the samples before it (``before_death``) and the cgroup's
    OOM-kill and peak counters read after it."""
    first = samples[0] if samples else None
    limit = samples[-1].ram_limit if samples else None
    peaks = [sample.ram_used for sample in samples]
    if (ram_peak_now is not None and first is not None and first.ram_peak is not None
            and ram_peak_now > first.ram_peak):
        peaks.append(ram_peak_now)
    peak = max(peaks, default=None)
    counted = (oom_kills_now is not None and first is not None and first.oom_kills is not None
               and oom_kills_now > first.oom_kills)
    at_limit = (returncode == -signal.SIGKILL and peak is not None and bool(limit)
                and peak >= (1 - OOM_MARGIN) * (limit or 0))
    out_of_memory = counted or at_limit
    return Death(_reason(returncode, out_of_memory), out_of_memory, limit, peak)


def signal_name(number: int) -> str | None:
    """``SIGKILL`` for 9; None for a number that names no signal here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def _reason(returncode: int | None, out_of_memory: bool) -> str | None:
    if out_of_memory:
        return "out of memory"
    if returncode is None:
        return None
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"
