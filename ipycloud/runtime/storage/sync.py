"""Incremental, interruptible sync of a folder to persistent storage (a mounted Drive, ...).

``sync(src, dst)`` lists both trees, decides every action by comparing the listings
(size and mtime, or content with ``checksum``), then copies what is new or changed. Each
file goes to a temporary name in its destination folder and is renamed into place, so a
final name never holds a torn copy and the destination may be on another file system
(``transfer`` says how copies are made durable). Nothing at ``dst`` is deleted unless
``delete=True``. Interrupting and rerunning completes the job; temporary files an
interrupted run left behind are removed by the next one.

Symbolic links are never followed: they are copied as links, with their target text as
is (a link pointing outside ``src`` points outside ``dst`` too). Where the destination
refuses links (Google Drive, FAT), they are reported as skipped, like sockets and pipes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipycloud.runtime.durable import remove_path
from ipycloud.runtime.storage import tree
from ipycloud.runtime.storage.failed_syncs import FailedSync, failure_of, forget_failure
from ipycloud.runtime.storage.transfer import Outcome, Placing, transfer
from ipycloud.runtime.storage.verify import hash_file
from ipycloud.runtime.units import format_bytes

__all__ = ["PathArg", "SyncReport", "check_pair", "sync"]

_NS = 1_000_000_000
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()

PathArg = str | os.PathLike[str]


@dataclass(frozen=True)
class SyncReport:
    """What one sync did (or, with ``dry_run``, would do); paths are relative, with ``/``.

    ``after_failure`` is the final sync at exit of the same folders that failed before it.
    """

    copied: tuple[str, ...]
    updated: tuple[str, ...]
    deleted: tuple[str, ...]
    unchanged: int
    bytes_copied: int
    dry_run: bool
    skipped: tuple[str, ...] = ()
    after_failure: FailedSync | None = None

    def summary(self) -> str:
        """One line: ``12 copied, 3 updated, 0 deleted, 980 unchanged (45.1 MiB)``."""
        line = (f"{len(self.copied)} copied, {len(self.updated)} updated, "
                f"{len(self.deleted)} deleted, {self.unchanged} unchanged")
        if self.skipped:
            line += f", {len(self.skipped)} skipped"
        line += f" ({format_bytes(self.bytes_copied)})"
        return f"dry run: {line}" if self.dry_run else line

    def __str__(self) -> str:
        """The summary line, and what it makes up for on a second one."""
        if self.after_failure is None:
            return self.summary()
        return f"{self.summary()}\n{self.after_failure.made_up()}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython display: as ``str``."""
        printer.text(str(self))


@dataclass
class _Plan:
    """The actions one sync takes, decided before anything is touched."""

    copy: list[str] = field(default_factory=list)
    update: list[str] = field(default_factory=list)
    mkdirs: list[str] = field(default_factory=list)
    replace: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unchanged: int = 0


def check_pair(src: PathArg, dst: PathArg) -> tuple[Path, Path]:
    """Resolved ``(src, dst)``; ValueError when src is missing or one lies inside the other."""
    source, target = Path(src).resolve(), Path(dst).resolve()
    if not source.is_dir():
        raise ValueError(f"sync source {str(source)!r} is not an existing folder")
    if target == source or target.is_relative_to(source):
        raise ValueError(f"sync destination {str(target)!r} lies inside the source {str(source)!r}")
    if source.is_relative_to(target):
        raise ValueError(f"sync source {str(source)!r} lies inside the destination {str(target)!r}")
    return source, target


def _lock_for(target: Path) -> threading.Lock:
    """One lock per destination, so syncs from threads of this process take turns."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(str(target), threading.Lock())


# ----------------------------------------------------------------------------- compare


def _same_mtime(src_ns: int, dst_ns: int) -> bool:
    """Equal mtimes, allowing a destination that keeps whole seconds only."""
    return src_ns == dst_ns or (dst_ns % _NS == 0 and src_ns // _NS == dst_ns // _NS)


def _same_file(source: str, target: str, rel: str, s: os.stat_result, d: os.stat_result,
               checksum: bool) -> bool:
    """Whether the destination file already holds the source file's version."""
    if s.st_size != d.st_size:
        return False
    if checksum:
        return (hash_file(tree.join(source, rel), md5=False)
                == hash_file(tree.join(target, rel), md5=False))
    return _same_mtime(s.st_mtime_ns, d.st_mtime_ns)


def _blocked(rel: str, blocked: list[str]) -> bool:
    """Whether ``rel`` lies under a folder that could not be made."""
    return bool(blocked) and any(rel.startswith(prefix + "/") for prefix in blocked)


def _plan(source: str, target: str, src_entries: tree.Listing, dst_entries: tree.Listing,
          delete: bool, checksum: bool) -> _Plan:
    """Decide every action by comparing the two listings."""
    plan, blocked = _Plan(), list[str]()
    for rel, s in src_entries.items():
        d = dst_entries.get(rel)
        if (d is not None and s.st_mtime_ns == d.st_mtime_ns and s.st_size == d.st_size
                and not checksum and not blocked
                and stat.S_ISREG(s.st_mode) and stat.S_ISREG(d.st_mode)):
            plan.unchanged += 1  # the common case, decided first
            continue
        kind = tree.kind(s.st_mode)
        dst_kind = tree.kind(d.st_mode) if d is not None else None
        if kind == "other" or _blocked(rel, blocked):
            plan.skipped.append(rel)
        elif d is None:
            (plan.mkdirs if kind == "dir" else plan.copy).append(rel)
        elif kind == dst_kind == "file":
            same = _same_file(source, target, rel, s, d, checksum)
            plan.unchanged += same
            if not same:
                plan.update.append(rel)
        elif kind != dst_kind and "dir" in (kind, dst_kind):
            _plan_conflict(plan, rel, kind, delete, blocked)
        elif kind == "link":
            same = dst_kind == "link" and (
                os.readlink(tree.join(source, rel)) == os.readlink(tree.join(target, rel)))
            plan.unchanged += same
            if not same:
                plan.update.append(rel)
        elif kind == "file":
            plan.update.append(rel)
    if delete:
        plan.delete = [rel for rel in reversed(dst_entries)
                       if rel not in src_entries and not _blocked(rel, plan.replace)]
    return plan


def _plan_conflict(plan: _Plan, rel: str, kind: str, delete: bool, blocked: list[str]) -> None:
    """A folder where a file belongs or the reverse: replaced with delete, else skipped."""
    if not delete:
        plan.skipped.append(rel)
        if kind == "dir":
            blocked.append(rel)
        return
    plan.replace.append(rel)
    (plan.mkdirs if kind == "dir" else plan.update).append(rel)


# ----------------------------------------------------------------------------- run


def _execute(source: str, target: str, plan: _Plan, src_entries: tree.Listing,
             progress: bool) -> Outcome:
    """Carry out a plan: replace conflicts, make folders, copy, then delete extras."""
    from tqdm.auto import tqdm

    outcome = Outcome(skipped=list(plan.skipped))
    for rel in plan.replace:
        remove_path(tree.join(target, rel))
        outcome.deleted.append(rel)
    for rel in plan.mkdirs:  # parents first; never the destination itself, should it go
        with contextlib.suppress(FileExistsError):
            os.mkdir(tree.join(target, rel))
    placing = Placing.for_target(target)
    try:
        with tqdm(total=_bytes(plan, src_entries), unit="B", unit_scale=True,
                  unit_divisor=1024, desc="sync", disable=not progress, leave=False) as bar:
            for names, done in ((plan.copy, outcome.copied), (plan.update, outcome.updated)):
                for rel in names:
                    link = tree.kind(src_entries[rel].st_mode) == "link"
                    transfer(tree.join(source, rel), tree.join(target, rel), rel, link, done,
                             outcome, placing, bar.update)
            placing.commit(outcome)
    except BaseException:
        with contextlib.suppress(OSError):
            placing.commit(outcome)  # copies finished before an interrupt are kept
        raise
    finally:
        placing.discard()  # whatever could not be committed
    _delete_extras(target, plan.delete, outcome)
    placing.finish(outcome)
    return outcome


def _bytes(plan: _Plan, src_entries: tree.Listing) -> int:
    """What the plan copies, in bytes, as listed (links count as nothing)."""
    return sum(src_entries[rel].st_size for rel in plan.copy + plan.update
               if tree.kind(src_entries[rel].st_mode) == "file")


def _delete_extras(target: str, rels: list[str], outcome: Outcome) -> None:
    """Remove destination entries the source lacks; folders only once empty."""
    for rel in rels:
        path = tree.join(target, rel)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            continue  # a folder that still holds something
        outcome.deleted.append(rel)
        outcome.touched.add(os.path.dirname(path))


def sync(src: PathArg, dst: PathArg, *, delete: bool = False, checksum: bool = False,
         dry_run: bool = False, progress: bool = True, create_dst: bool = True) -> SyncReport:
    """Make ``dst`` hold what ``src`` holds, copying only new or changed files.

    Files are compared by size and mtime, or by sha256 content with ``checksum``. Entries
    only in ``dst`` are kept unless ``delete``. ``dry_run`` reports and touches nothing.
    ``dst`` and its parents are made where missing, unless ``create_dst`` is False: then a
    missing ``dst`` is an error (FileNotFoundError), as when its storage was unmounted and
    the folder below the mount point would take the files.
    A recorded failure of the pair's final sync at exit is named in the report, and
    forgotten once this sync succeeds.
    ValueError when ``src`` is not a folder or one folder lies inside the other.
    """
    source_path, target_path = check_pair(src, dst)
    source, target = str(source_path), str(target_path)
    earlier = failure_of(source_path, target_path)
    if not dry_run and create_dst:
        target_path.mkdir(parents=True, exist_ok=True)
    elif not dry_run:
        _check_folder(target)
    with _lock_for(target_path):
        src_entries, _ = tree.scan(source)
        dst_entries, temps = tree.scan(target)
        leftovers = tree.take_leftovers(dst_entries, temps, src_entries)
        if not dry_run:
            tree.remove_stale_temps(target, leftovers)
        plan = _plan(source, target, src_entries, dst_entries, delete, checksum)
        if dry_run:
            return SyncReport(
                copied=_sorted(plan.copy), updated=_sorted(plan.update),
                deleted=_sorted(plan.replace + plan.delete), unchanged=plan.unchanged,
                bytes_copied=_bytes(plan, src_entries), dry_run=True,
                skipped=_sorted(plan.skipped), after_failure=earlier)
        outcome = _execute(source, target, plan, src_entries, progress)
    if earlier is not None:
        forget_failure(source_path, target_path)
    return SyncReport(copied=_sorted(outcome.copied), updated=_sorted(outcome.updated),
                      deleted=_sorted(outcome.deleted), unchanged=plan.unchanged,
                      bytes_copied=outcome.bytes_copied, dry_run=False,
                      skipped=_sorted(outcome.skipped), after_failure=earlier)


def _check_folder(target: str) -> None:
    """FileNotFoundError or NotADirectoryError, in words, unless ``target`` is a folder."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"sync destination {target!r} is missing: is "
                                "its storage still mounted?") from None
    if not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, f"sync destination {target!r} is not a folder")


def _sorted(rels: list[str]) -> tuple[str, ...]:
    """Relative paths in a stable order for the report (listings come in disk order)."""
    return tuple(sorted(rels))
