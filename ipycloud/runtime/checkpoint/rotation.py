"""Keeping a checkpoint folder tidy under its lock: what a dead writer left behind goes,
and the checkpoints the keep rules no longer cover."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ipycloud.runtime.checkpoint import catalog
from ipycloud.runtime.checkpoint.catalog import CheckpointInfo
from ipycloud.runtime.checkpoint.selection import KeepBest, ranked
from ipycloud.runtime.durable import fsync_folder, stale_temporaries


def remove_leftovers(directory: Path) -> None:
    """Temporary files of dead writers and data files whose manifest never appeared."""
    leftovers = list(stale_temporaries(directory))
    leftovers += [data for data in directory.glob(f"step-*{catalog.DATA_SUFFIX}")
                  if catalog.is_checkpoint_name(data.stem)
                  and not data.with_suffix(catalog.MANIFEST_SUFFIX).exists()]
    for path in leftovers:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if leftovers:
        fsync_folder(directory)


def rotate(directory: Path, infos: list[CheckpointInfo], keep_last: int | None,
           keep_best: KeepBest | None) -> None:
    """Delete what the keep rules no longer cover among ``infos`` (oldest first) of the
    run of the newest, the last of them; runs only after that one is complete.

    Checkpoints saved before runs existed count as the run's own.
    """
    infos = [info for info in infos if info.run in (infos[-1].run, None)]
    keep = {infos[-1].name} | {info.name for info in infos if info.tag}
    untagged = [info for info in infos if not info.tag]
    if keep_last is None:
        keep |= {info.name for info in untagged}
    else:
        keep |= {info.name for info in untagged[-keep_last:]}
    if keep_best is not None:
        metric, mode, count = keep_best
        keep |= {info.name for info in ranked(infos, metric, mode)[:count]}
    doomed = [info for info in infos if info.name not in keep]
    for info in doomed:  # the manifest goes first: the checkpoint vanishes atomically
        info.manifest_path.unlink(missing_ok=True)
        info.data_path.unlink(missing_ok=True)
    if doomed:
        fsync_folder(directory)
