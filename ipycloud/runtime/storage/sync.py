"""Incremental, interruptible sync of a folder to persistent storage (a mounted Drive, ...).

``sync(src, dst)`` copies what is new or changed, one file at a time: each goes to a
temporary name in its destination folder, is fsynced with its mtime and permission bits,
then renamed into place, so a final name never holds a torn copy and the destination may
be on another file system. Nothing at ``dst`` is deleted unless ``delete=True``.
Interrupting and rerunning completes the job; temporary files an interrupted run left
behind are removed by the next one.

Symbolic links are never followed: they are copied as links, with their target text as
is (a link pointing outside ``src`` points outside ``dst`` too). Where the destination
refuses links (Google Drive, FAT), they are reported as skipped, like sockets and pipes.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ipycloud.runtime.durable import fsync_folder, stale_temporary, temp_name_for
from ipycloud.runtime.units import format_bytes

__all__ = ["BackgroundSync", "SyncReport", "sync"]

_log = logging.getLogger(__name__)
_CHUNK = 1024 * 1024
_RETRIES = 3
_BATCH_FILES = 1000  # staged copies made durable together
_BATCH_BYTES = 64 * 1024 * 1024
_FSYNC_THREADS = 8
_TEMP = re.compile(r"^\.tmp-(\d+)-[0-9a-f]{8}-.")
_NS = 1_000_000_000
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()

PathArg = str | os.PathLike[str]


@dataclass(frozen=True)
class SyncReport:
    """What one sync did (or, with ``dry_run``, would do); paths are relative, with ``/``."""

    copied: tuple[str, ...]
    updated: tuple[str, ...]
    deleted: tuple[str, ...]
    unchanged: int
    bytes_copied: int
    dry_run: bool
    skipped: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: ``12 copied, 3 updated, 0 deleted, 980 unchanged (45.1 MiB)``."""
        line = (f"{len(self.copied)} copied, {len(self.updated)} updated, "
                f"{len(self.deleted)} deleted, {self.unchanged} unchanged")
        if self.skipped:
            line += f", {len(self.skipped)} skipped"
        line += f" ({format_bytes(self.bytes_copied)})"
        return f"dry run: {line}" if self.dry_run else line

    def __str__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython display: the summary line."""
        printer.text(self.summary())


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


# ----------------------------------------------------------------------------- paths


def _check_pair(src: PathArg, dst: PathArg) -> tuple[Path, Path]:
    """Resolved ``(src, dst)``; ValueError when src is missing or one lies inside the other."""
    source, target = Path(src).resolve(), Path(dst).resolve()
    if not source.is_dir():
        raise ValueError(f"sync source {str(source)!r} is not an existing folder")
    if target == source or target.is_relative_to(source):
        raise ValueError(f"sync destination {str(target)!r} lies inside the source {str(source)!r}")
    if source.is_relative_to(target):
        raise ValueError(f"sync source {str(source)!r} lies inside the destination {str(target)!r}")
    return source, target


def _join(root: Path, rel: str) -> Path:
    """The path of ``rel`` (``/``-separated) under ``root``."""
    return root.joinpath(*rel.split("/"))


def _scan(root: Path) -> dict[str, os.stat_result]:
    """Every entry under ``root`` (links not followed) by relative path, parents first."""
    found: dict[str, os.stat_result] = {}
    pending = [""]
    while pending:
        prefix = pending.pop()
        try:
            entries = list(os.scandir(_join(root, prefix) if prefix else root))
        except FileNotFoundError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            rel = f"{prefix}/{entry.name}" if prefix else entry.name
            try:
                found[rel] = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(found[rel].st_mode):
                pending.append(rel)
    return dict(sorted(found.items()))


def _is_temp(rel: str) -> bool:
    """Whether ``rel`` names one of sync's temporary files."""
    return _TEMP.match(rel.rsplit("/", 1)[-1]) is not None


def _clean_temps(root: Path, entries: dict[str, os.stat_result]) -> None:
    """Remove temporary files left by interrupted runs (this process's, or dead ones')."""
    for rel in [rel for rel in entries if _is_temp(rel)]:
        if stale_temporary(rel.rsplit("/", 1)[-1]):
            _join(root, rel).unlink(missing_ok=True)
        del entries[rel]


def _lock_for(target: Path) -> threading.Lock:
    """One lock per destination, so syncs from threads of this process take turns."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(str(target), threading.Lock())


# ----------------------------------------------------------------------------- compare


def _digest(path: Path) -> str:
    """The sha256 of a file's content."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in _read_chunks(handle):
            sha.update(chunk)
    return sha.hexdigest()


def _same_mtime(src_ns: int, dst_ns: int) -> bool:
    """Equal mtimes, allowing a destination that keeps whole seconds only."""
    return src_ns == dst_ns or (dst_ns % _NS == 0 and src_ns // _NS == dst_ns // _NS)


def _same_file(source: Path, target: Path, rel: str, s: os.stat_result, d: os.stat_result,
               checksum: bool) -> bool:
    """Whether the destination file already holds the source file's version.

    Paths are built only to hash: the size-and-mtime test needs the listings alone.
    """
    if s.st_size != d.st_size:
        return False
    if checksum:
        return _digest(_join(source, rel)) == _digest(_join(target, rel))
    return _same_mtime(s.st_mtime_ns, d.st_mtime_ns)


def _kind(mode: int) -> str:
    """``dir``, ``file``, ``link`` or ``other``."""
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "link" if stat.S_ISLNK(mode) else "other"


def _blocked(rel: str, blocked: list[str]) -> bool:
    """Whether ``rel`` lies under a folder that could not be made."""
    return any(rel.startswith(prefix + "/") for prefix in blocked)


def _plan(source: Path, target: Path, src_entries: dict[str, os.stat_result],
          dst_entries: dict[str, os.stat_result], delete: bool, checksum: bool) -> _Plan:
    """Decide every action by comparing the two listings."""
    plan, blocked = _Plan(), list[str]()
    for rel, s in src_entries.items():
        kind, d = _kind(s.st_mode), dst_entries.get(rel)
        if _blocked(rel, blocked) or kind == "other":
            plan.skipped.append(rel)
        elif d is None:
            (plan.mkdirs if kind == "dir" else plan.copy).append(rel)
        elif _kind(d.st_mode) != kind and (kind == "dir" or _kind(d.st_mode) == "dir"):
            _plan_conflict(plan, rel, kind, delete, blocked)
        elif kind == "file" and _kind(d.st_mode) == "file":
            same = _same_file(source, target, rel, s, d, checksum)
            plan.unchanged += same
            if not same:
                plan.update.append(rel)
        elif kind == "link":
            same = _kind(d.st_mode) == "link" and (
                os.readlink(_join(source, rel)) == os.readlink(_join(target, rel)))
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


# ----------------------------------------------------------------------------- copy


def _read_chunks(handle: BinaryIO) -> Iterator[bytes]:
    """A file's content in chunks (the copy's read loop)."""
    while chunk := handle.read(_CHUNK):
        yield chunk


def _same_version(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stats describe the same, unchanged file."""
    return (a.st_size, a.st_mtime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ino)


def _write_temp(source: Path, temp: Path, on_bytes: Callable[[int], object]) -> bool:
    """Copy ``source`` into ``temp`` with its metadata; False if it changed meanwhile.

    The copy is not fsynced here: ``_Batch`` makes a batch durable before renaming it.
    """
    with open(source, "rb") as reader:
        before = os.fstat(reader.fileno())
        written = 0
        with open(temp, "xb") as writer:
            for chunk in _read_chunks(reader):
                writer.write(chunk)
                written += len(chunk)
                on_bytes(len(chunk))
                if written > before.st_size:
                    return False  # growing while read: stop rather than chase it
            writer.flush()
            after = os.fstat(reader.fileno())
            if not _same_version(before, after) or written != after.st_size:
                return False
            os.chmod(temp, stat.S_IMODE(before.st_mode) & 0o777)
            os.utime(temp, ns=(before.st_atime_ns, before.st_mtime_ns))
    return True


def _stage_file(source: Path, target: Path, on_bytes: Callable[[int], object]) -> Path | None:
    """A complete copy of ``source`` under a temporary name beside ``target``, or None when
    the source kept changing (or vanished)."""
    for _ in range(_RETRIES + 1):
        temp = temp_name_for(target)
        try:
            if _write_temp(source, temp, on_bytes):
                return temp
        except FileNotFoundError:
            temp.unlink(missing_ok=True)
            if os.path.lexists(source):
                raise
            return None  # deleted from the source since the scan
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        temp.unlink(missing_ok=True)
    return None


def _fsync_file(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@dataclass
class _Batch:
    """Staged copies made durable together, then renamed into place.

    One fsync per file, one after the other, costs a journal commit each; issued together
    from a few threads, the file system commits them in groups. No final name ever holds
    a copy that is not on disk.
    """

    staged: list[tuple[Path, Path, str, list[str]]] = field(default_factory=list)
    bytes: int = 0

    def add(self, temp: Path, target: Path, rel: str, done: list[str], size: int) -> None:
        self.staged.append((temp, target, rel, done))
        self.bytes += size

    def full(self) -> bool:
        return len(self.staged) >= _BATCH_FILES or self.bytes >= _BATCH_BYTES

    def commit(self, run: _Run) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=_FSYNC_THREADS) as pool:
            list(pool.map(_fsync_file, [temp for temp, _, _, _ in self.staged]))
        for temp, target, rel, done in self.staged:
            os.replace(temp, target)
            done.append(rel)
            run.touched.add(target.parent)
        self.staged, self.bytes = [], 0

    def discard(self) -> None:
        for temp, _, _, _ in self.staged:
            temp.unlink(missing_ok=True)
        self.staged, self.bytes = [], 0


def _copy_link(source: Path, target: Path) -> bool:
    """Copy one symbolic link as a link; False where the destination refuses links."""
    temp = temp_name_for(target)
    try:
        os.symlink(os.readlink(source), temp)
        os.replace(temp, target)
        return True
    except OSError:
        return False
    finally:
        if temp.is_symlink():
            temp.unlink()


def _remove(path: Path) -> None:
    """Remove a file, a link or a whole folder tree (links inside are not followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- run


@dataclass
class _Run:
    """The mutable outcome of executing a plan."""

    copied: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_copied: int = 0
    touched: set[Path] = field(default_factory=set)


def _transfer(source: Path, target: Path, rel: str, run: _Run, batch: _Batch,
              done: list[str], on_bytes: Callable[[int], object]) -> None:
    """Copy one entry: a link at once, a file into the batch (listed in ``done`` once
    the batch is committed)."""
    src_path, dst_path = _join(source, rel), _join(target, rel)
    if src_path.is_symlink():
        if _copy_link(src_path, dst_path):
            run.touched.add(dst_path.parent)
            done.append(rel)
        else:
            run.skipped.append(rel)
        return
    temp = _stage_file(src_path, dst_path, on_bytes)
    if temp is None:
        run.skipped.append(rel)
        return
    size = temp.stat().st_size
    run.bytes_copied += size
    batch.add(temp, dst_path, rel, done, size)
    if batch.full():
        batch.commit(run)


def _execute(source: Path, target: Path, plan: _Plan, progress: bool) -> _Run:
    """Carry out a plan: replace conflicts, make folders, copy, then delete extras."""
    from tqdm.auto import tqdm

    run = _Run(skipped=list(plan.skipped))
    for rel in plan.replace:
        _remove(_join(target, rel))
        run.deleted.append(rel)
    for rel in plan.mkdirs:
        _join(target, rel).mkdir(exist_ok=True)
    total = sum(_size(_join(source, rel)) for rel in plan.copy + plan.update)
    batch = _Batch()
    try:
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="sync",
                  disable=not progress, leave=False) as bar:
            for names, done in ((plan.copy, run.copied), (plan.update, run.updated)):
                for rel in names:
                    _transfer(source, target, rel, run, batch, done, bar.update)
            batch.commit(run)
    except BaseException:
        with contextlib.suppress(OSError):
            batch.commit(run)  # copies finished before an interrupt are kept
        raise
    finally:
        batch.discard()  # whatever could not be committed
    _delete_extras(target, plan.delete, run)
    for folder in run.touched:
        if folder.is_dir():
            fsync_folder(folder)
    return run


def _size(path: Path) -> int:
    """A regular file's size (0 for links and vanished files)."""
    try:
        return path.stat().st_size if not path.is_symlink() else 0
    except FileNotFoundError:
        return 0


def _delete_extras(target: Path, rels: list[str], run: _Run) -> None:
    """Remove destination entries the source lacks; folders only once empty."""
    for rel in rels:
        path = _join(target, rel)
        if path.is_dir() and not path.is_symlink():
            try:
                path.rmdir()
            except OSError:
                continue
        else:
            path.unlink(missing_ok=True)
        run.deleted.append(rel)
        run.touched.add(path.parent)


def _dry_report(source: Path, plan: _Plan) -> SyncReport:
    """The report of a plan that is not carried out."""
    return SyncReport(
        copied=tuple(plan.copy), updated=tuple(plan.update),
        deleted=tuple(plan.replace + plan.delete), unchanged=plan.unchanged,
        bytes_copied=sum(_size(_join(source, rel)) for rel in plan.copy + plan.update),
        dry_run=True, skipped=tuple(plan.skipped))


def sync(src: PathArg, dst: PathArg, *, delete: bool = False, checksum: bool = False,
         dry_run: bool = False, progress: bool = True) -> SyncReport:
    """Make ``dst`` hold what ``src`` holds, copying only new or changed files.

    Files are compared by size and mtime, or by sha256 content with ``checksum``. Entries
    only in ``dst`` are kept unless ``delete``. ``dry_run`` reports and touches nothing.
    ValueError when ``src`` is not a folder or one folder lies inside the other.
    """
    source, target = _check_pair(src, dst)
    if not dry_run:
        target.mkdir(parents=True, exist_ok=True)
    with _lock_for(target):
        src_entries = {rel: s for rel, s in _scan(source).items() if not _is_temp(rel)}
        dst_entries = _scan(target) if target.is_dir() else {}
        if not dry_run:
            _clean_temps(target, dst_entries)
        else:
            dst_entries = {rel: d for rel, d in dst_entries.items() if not _is_temp(rel)}
        plan = _plan(source, target, src_entries, dst_entries, delete, checksum)
        if dry_run:
            return _dry_report(source, plan)
        run = _execute(source, target, plan, progress)
    return SyncReport(copied=tuple(run.copied), updated=tuple(run.updated),
                      deleted=tuple(run.deleted), unchanged=plan.unchanged,
                      bytes_copied=run.bytes_copied, dry_run=False, skipped=tuple(run.skipped))


# ----------------------------------------------------------------------------- background


class BackgroundSync:
    """Sync ``src`` to ``dst`` every ``every_s`` seconds in a daemon thread.

    A final sync runs at ``stop()`` and at interpreter exit. An error in the background is
    logged and kept in ``last_error``; ``stop()`` raises it. The thread never prints.
    """

    def __init__(self, src: PathArg, dst: PathArg, every_s: float, **sync_options: Any) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, not {every_s!r}")
        _check_pair(src, dst)
        self.src, self.dst, self.every_s = src, dst, every_s
        self.options = {"progress": False, **sync_options}
        self.last_report: SyncReport | None = None
        self.last_error: BaseException | None = None
        self._unreported = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> BackgroundSync:
        """Start syncing now and every ``every_s`` seconds; a no-op when already running."""
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ipycloud-sync", daemon=True)
        atexit.register(self._at_exit)
        self._thread.start()
        return self

    def stop(self, final: bool = True) -> SyncReport | None:
        """Stop the thread, then sync once more unless ``final`` is False.

        Returns the last report; raises the error a background run kept, if any.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        atexit.unregister(self._at_exit)
        if final:
            self.last_report = sync(self.src, self.dst, **self.options)
        if self._unreported and self.last_error is not None:
            self._unreported = False
            raise self.last_error
        return self.last_report

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        detail = f"error: {self.last_error!r}" if self.last_error else str(self.last_report)
        return f"<BackgroundSync {state} every {self.every_s} s, {detail}>"

    def _loop(self) -> None:
        """The thread: sync, then wait, until stopped."""
        while not self._stop.is_set():
            self._run_once()
            self._stop.wait(self.every_s)

    def _run_once(self) -> None:
        """One background sync, its error kept rather than lost."""
        try:
            self.last_report = sync(self.src, self.dst, **self.options)
        except Exception as error:  # kept for stop() and shown in the log
            self.last_error, self._unreported = error, True
            _log.error("background sync %s -> %s failed: %s", self.src, self.dst, error)

    def _at_exit(self) -> None:
        """Interpreter exit: stop and sync a last time."""
        self.stop(final=True)
