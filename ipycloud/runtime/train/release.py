"""Giving the machine back when a run is safely over: ``fit(..., release=True)``.

The machine goes only once nothing but the checkpoint folder holds the run: the final
checkpoint (that of the run's last step: an earlier one is not enough) is read back from
the folder and matches its manifest, and every running background sync of the folder
(``storage.periodic_sync``) has made its final pass. Otherwise it stays, and one line says
why. Alerts still queued go first (waiting a few seconds).

On Colab the run must also be on storage that outlives the machine: the folder, or the
destination of a sync of it, off the machine's own disk. Drive's mount caches writes, so
where the run is on Drive, ``google.colab.drive.flush_and_unmount()`` pushes them first
(its failure keeps the machine). Then the runtime is unassigned
(``google.colab.runtime.unassign()``): the notebook disconnects and the machine, GPU and
billing end. Elsewhere the kernel ends once the cell is done, as ``exit`` does (a Jupyter
server may start a fresh, idle one); outside a kernel, the script ends with SystemExit.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any

from ipycloud.runtime import notify
from ipycloud.runtime.checkpoint import integrity
from ipycloud.runtime.checkpoint.resilient import ResilientSaver
from ipycloud.runtime.kernel import running_kernel
from ipycloud.runtime.messages import describe_error
from ipycloud.runtime.storage import filesystem
from ipycloud.runtime.storage.periodic_sync import BackgroundSync, running_syncs

ALERTS_WAIT_S = 10.0  # how long queued alerts may take before the machine goes
DRIVE_FLUSH_WAIT_S = 3600.0  # how long Drive may take to receive the writes it caches
PREFIX = "ipycloud.fit: "


def keep_machine(why: str) -> None:
    """Say in one line why the machine stays."""
    print(f"{PREFIX}release=True: keeping the machine: {why}", flush=True)


def release_when_safe(saver: ResilientSaver, step: int) -> None:
    """Release the machine if the run's final checkpoint, that of ``step``, is safe in
    its folder (see the module); otherwise say why not."""
    folder = saver.manager.directory
    syncs = _syncs_of(folder)
    colab = _colab_runtime()
    problem = _unsafe(saver, step, syncs) or (
        _kept_off_colab(folder, syncs) if colab is not None else None)
    if problem is not None:
        keep_machine(problem)
        return
    notify.flush(ALERTS_WAIT_S)
    if colab is not None:
        print(f"{PREFIX}the run is saved and verified: releasing this Colab machine",
              flush=True)
        colab.unassign()
        return
    kernel = running_kernel()
    if kernel is not None and getattr(kernel, "shell", None) is not None:
        print(f"{PREFIX}the run is saved and verified: shutting this kernel down to free "
              "the machine", flush=True)
        kernel.shell.ask_exit()  # the kernel ends once this cell is done
        return
    print(f"{PREFIX}the run is saved and verified: ending this process to free the machine",
          flush=True)
    raise SystemExit(0)


def _syncs_of(folder: Path) -> list[BackgroundSync]:
    """The running background syncs of ``folder`` or of a folder above it."""
    resolved = folder.resolve()
    return [background for background in running_syncs()
            if background.src == resolved or background.src in resolved.parents]


def _unsafe(saver: ResilientSaver, step: int, syncs: list[BackgroundSync]) -> str | None:
    """Why the run is not safe in its folder yet, or None: the final checkpoint read back
    and verified, then each background sync of the folder through its final pass."""
    folder = saver.manager.directory
    final = saver.newest
    if final is None:
        return f"no checkpoint of this run is in {folder}"
    if saver.lost is not None or final.step != step:
        return (f"the final checkpoint (step {step}) is not saved; the newest is step "
                f"{final.step}, in {final.directory}")
    if final.directory != folder:
        return f"the final checkpoint is only in {final.directory}, not in {folder}"
    try:
        damage = integrity.problem(final, read_back=True)
    except OSError as error:
        return f"the final checkpoint cannot be read back from {folder}: {describe_error(error)}"
    if damage is not None:
        return f"the final checkpoint {final.name} fails its check when read back: {damage}"
    for background in syncs:
        # An earlier run's error is moot once the final pass works.
        with contextlib.suppress(Exception):
            background.stop(final=False)
        try:
            background.sync_now()
        except Exception as error:
            return (f"the final sync {background.src} -> {background.dst} failed: "
                    f"{describe_error(error)}")
    return None


def _kept_off_colab(folder: Path, syncs: list[BackgroundSync]) -> str | None:
    """On Colab: why the run would go with the machine, or None once storage that
    outlives it holds the run, Drive flushed (its mount caches writes: a read-back
    through it shows the cache, not Drive)."""
    lasting = [place for place in (folder, *(background.dst for background in syncs))
               if not filesystem.on_machine_disk(place)]
    if not lasting:
        return (f"{folder} is on this machine's own disk and no sync copies it to storage "
                "that outlives the machine, so its only copy would go with it: pass "
                "checkpoint= a folder on Drive (ipycloud.mount() mounts it), or sync this "
                "one to Drive (%mount_storage sync)")
    if any(filesystem.filesystem_type(place) == filesystem.DRIVE for place in lasting):
        from google.colab import drive

        print(f"{PREFIX}pushing the writes Drive's mount still caches to Drive "
              "(google.colab.drive.flush_and_unmount) before releasing", flush=True)
        try:
            drive.flush_and_unmount(timeout_ms=int(DRIVE_FLUSH_WAIT_S * 1000))
        except Exception as error:  # Colab raises ValueError when the push fails
            return (f"flushing Drive failed ({describe_error(error)}): Drive may not have "
                    "the run yet")
    return None


def _colab_runtime() -> Any | None:
    """``google.colab.runtime`` on Colab, else None."""
    try:
        runtime = importlib.import_module("google.colab.runtime")
    except ImportError:
        return None
    return runtime if hasattr(runtime, "unassign") else None
