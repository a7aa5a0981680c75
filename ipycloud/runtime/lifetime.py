"""Processes that must not outlive the process they work for.

A checkpoint writer process and a ``launch`` rank write into the notebook's checkpoint
folders. If the kernel that started them dies (killed by the out-of-memory killer, or by
a restart), they end too, at once, instead of going on writing beside the next kernel.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time


def end_with(parent: int) -> None:
    """End this process (``os._exit``) as soon as ``parent`` dies, even mid-work.

    A daemon thread waits on the parent's pidfd (Linux), else looks for a new parent twice
    a second. A process forked from this one keeps no descriptor of the parent (nor the
    thread). Call it in a child of ``parent``, passing the parent's PID as the parent
    knew it: if the parent has died already, this process ends here.
    """
    try:
        watched: int | None = os.pidfd_open(parent)
    except (AttributeError, OSError):
        watched = None
    if os.getppid() != parent:  # gone already (the pidfd may name another process)
        os._exit(0)
    if watched is not None and hasattr(os, "register_at_fork"):
        held = [watched]

        def forget_in_child() -> None:
            while held:
                with contextlib.suppress(OSError):
                    os.close(held.pop())

        os.register_at_fork(after_in_child=forget_in_child)

    def watch() -> None:
        while os.getppid() == parent:
            if watched is not None:
                select.select([watched], [], [])  # readable once the parent has exited
            else:
                time.sleep(0.5)
        os._exit(0)  # what it was writing stays a temporary file, removed by the next save

    threading.Thread(target=watch, name="ipycloud-end-with-parent", daemon=True).start()


def end_on_sigterm_from(sender: int) -> None:
    """Ignore SIGTERM in this process, except from ``sender``: that one ends it at once.

    ``sender`` is the process this one works for: its SIGTERM is a request to end
    (multiprocessing's ``terminate``, its exit handler's among them), where another's is
    the machine going away, which this process outlives until ``sender`` has saved. SIGTERM
    is blocked in every thread and taken, with its sender's PID, by a daemon thread; where
    that cannot be told (no ``sigwaitinfo``), SIGTERM is only ignored. Call it in the main
    thread, before starting threads.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # inherited by new threads

    def take() -> None:
        while signal.sigwaitinfo({signal.SIGTERM}).si_pid != sender:
            pass
        os._exit(0)

    threading.Thread(target=take, name="ipycloud-sigterm-from-parent", daemon=True).start()
