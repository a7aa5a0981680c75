"""Collecting what the ranks of a launch carry back, in the notebook: each rank's return
value, or its error and traceback; a rank that died without saying; which failure caused
the others."""

from __future__ import annotations

import pickle
import signal
import time
from dataclasses import dataclass
from multiprocessing import connection
from typing import Any

from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.train.launch_errors import LaunchError, RemoteTraceback
from ipycloud.runtime.train.rank_processes import KILL_GRACE_S, RankProcess

_POLL_S = 0.5  # the longest the notebook sleeps before looking at its workers again
_SETTLE_S = 1.0  # how long a reported failure waits for silent ranks to show they died
_SAVE_GRACE_S = 30.0  # time the others get after a rank ended by SIGTERM (the first saves)


@dataclass(frozen=True)
class RankFailure:
    """Why one rank failed; ``reported`` is False when it died without saying."""

    rank: int
    summary: str
    reported: bool
    when: float  # time.monotonic() of the failure (reported) or of noticing it (died)
    exitcode: int | None = None
    traceback: str | None = None


def collect_results(workers: list[RankProcess], nprocs: int) -> list[Any]:
    """Every rank's return value, or LaunchError for the rank that failed first."""
    results: dict[int, Any] = {}
    while len(results) < nprocs:
        pending = [worker for worker in workers if worker.rank not in results]
        _wait_for_any(pending, _POLL_S)
        failures = _gather(pending, results)
        if failures:
            if all(failure.reported for failure in failures):
                done = results.keys() | {failure.rank for failure in failures}
                failures += _late_deaths([w for w in pending if w.rank not in done])
            failure = _root_cause(failures)
            remote = RemoteTraceback(failure.traceback) if failure.traceback else None
            raise _launch_error(failure, nprocs) from remote
    return [results[rank] for rank in range(nprocs)]


def _wait_for_any(workers: list[RankProcess], timeout: float) -> None:
    """Sleep until a worker reports or exits, or ``timeout`` seconds pass."""
    connection.wait([worker.reader for worker in workers]
                    + [worker.process.sentinel for worker in workers], timeout=timeout)


def _gather(workers: list[RankProcess], results: dict[int, Any]) -> list[RankFailure]:
    """Store the values of ranks that returned; the failures of the ranks that failed."""
    failures: list[RankFailure] = []
    for worker in workers:
        outcome = _outcome(worker)
        if isinstance(outcome, RankFailure):
            failures.append(outcome)
        elif outcome is not None:
            results[worker.rank] = outcome[0]
    return failures


def _late_deaths(workers: list[RankProcess]) -> list[RankFailure]:
    """The failures of still-silent ranks that show within _SETTLE_S seconds.

    A rank killed mid-collective closes its sockets while it exits; a peer can fail on them
    and report before the exit is visible here, so a reported error is not blamed until the
    silent ranks have had a moment to show that they died.
    """
    deadline = time.monotonic() + _SETTLE_S
    failures: list[RankFailure] = []
    results: dict[int, Any] = {}
    while workers and time.monotonic() < deadline:
        _wait_for_any(workers, deadline - time.monotonic())
        failures += _gather(workers, results)
        done = results.keys() | {failure.rank for failure in failures}
        workers = [worker for worker in workers if worker.rank not in done]
    return failures


def _outcome(worker: RankProcess) -> tuple[Any] | RankFailure | None:
    """(value,) when the rank returned, a RankFailure, or None while it is still running."""
    if worker.reader.poll():
        try:
            message = pickle.loads(worker.reader.recv_bytes())
        except EOFError:  # it closed its end without reporting: it is exiting
            return _death(worker)
        except Exception as error:
            summary = f"its return value cannot be unpickled: {describe_error(error)}"
            return RankFailure(worker.rank, summary, True, time.monotonic())
        if message[0] == "ok":
            return (message[1],)
        _, summary, text, when = message
        return RankFailure(worker.rank, summary, True, when, traceback=text)
    # The sentinel is ready as soon as the process starts to exit, while its sockets close:
    # before a peer can fail on them and report it, which waitpid (is_alive) is not.
    if connection.wait([worker.process.sentinel], timeout=0):
        return _death(worker)
    return None


def _death(worker: RankProcess) -> RankFailure:
    worker.process.join(KILL_GRACE_S)  # reap it for its exit status
    code = worker.process.exitcode
    if code is None:
        how = "closed its result pipe and is still running"
    elif code < 0:
        how = f"killed by signal {_signal_name(-code)}"
    else:
        how = f"exited with code {code}"
    return RankFailure(worker.rank, f"died without reporting: {how}", False, time.monotonic(),
                    exitcode=code)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _root_cause(failures: list[RankFailure]) -> RankFailure:
    """The failure that most likely caused the others seen with it.

    A rank that died unreported is blamed first (its peers then fail on closed
    connections), then the earliest reported error.
    """
    return min(failures, key=lambda failure: (failure.reported, failure.when))


def stop_grace(error: LaunchError) -> float:
    """Seconds the other ranks get to end by themselves after ``error``: a rank ended by
    SIGTERM stops with its group at one step, which the first rank may still be saving,
    so the others get the time a spot VM gives between SIGTERM and SIGKILL; none after
    any other failure."""
    return _SAVE_GRACE_S if error.exitcode == -signal.SIGTERM else 0.0


def _launch_error(failure: RankFailure, nprocs: int) -> LaunchError:
    verb = "failed: " if failure.reported else ""
    return LaunchError(f"rank {failure.rank} of {nprocs} {verb}{failure.summary}",
                       rank=failure.rank, exitcode=failure.exitcode,
                       remote_traceback=failure.traceback)
