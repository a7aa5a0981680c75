"""``%mount_storage``: persistent project folders, verified downloads, safe extraction, sync."""

from __future__ import annotations

import contextlib
import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ipycloud.magics._arguments import (
    duration,
    expand_home,
    help_option,
    parse_line,
    refuse_options,
    size,
    user_path,
)
from ipycloud.magics._display import Notice
from ipycloud.magics._errors import DownloadFailed
from ipycloud.runtime.units import counted

if TYPE_CHECKING:
    import argparse

    from ipycloud.runtime.storage.periodic_sync import BackgroundSync

MOUNT_KINDS = ("auto", "drive", "kaggle", "local")
ACTIONS = (*MOUNT_KINDS, "gdrive", "download", "sync", "status")
# The options each use of the magic takes; any other option given is refused.
OPTIONS = {
    "mount": {"project", "force"},
    "kaggle download": {"competition", "force", "dest"},
    "gdrive": {"force", "dest", "sha256", "md5"},
    "download": {"dest", "sha256", "md5", "extract", "max_total_bytes"},
    "sync": {"delete", "checksum", "dry_run", "every"},
    "sync --stop": {"stop"},
    "status": set(),
}
# The runtime's words for its parameters, and this magic's for the same choice.
SPELLINGS = {"competition": "--competition", "max_total_bytes": "--max-total-bytes SIZE",
             "force": "--force", "dest": "--dest", "auto": "%mount_storage auto",
             "local": "%mount_storage local"}


@magics_class
class StorageMagics(Magics):
    """Storage that outlives the session, and data moved into it safely."""

    @help_option
    @magic_arguments()
    @argument("action", nargs="?", default="auto", choices=ACTIONS, help="what to do")
    @argument("operands", nargs="*",
              help="download: URL; kaggle: OWNER/DATASET or a competition; gdrive: ID or "
                   "share link; sync: SRC DST")
    @argument("--project", help="project folder name (mount)")
    @argument("--force", action="store_true",
              help="remount Drive, mending a stale mount; kaggle, gdrive: download again")
    @argument("--competition", action="store_true", help="kaggle: a competition's data")
    @argument("--dest", type=user_path,
              help="download folder (default: the project's data/, else ./data)")
    @argument("--sha256", help="expected SHA-256 of the download")
    @argument("--md5", help="expected MD5 of the download")
    @argument("--extract", action="store_true", help="extract the downloaded archive safely")
    @argument("--max-total-bytes", type=size, metavar="SIZE",
              help="--extract: the most the files may take, e.g. 50G (default: the free "
                   "space there less a margin)")
    @argument("--delete", action="store_true", help="sync: delete what SRC no longer has")
    @argument("--checksum", action="store_true", help="sync: compare contents, not mtimes")
    @argument("--dry-run", action="store_true", help="sync: show what would change")
    @argument("--every", type=duration,
              help="sync: repeat in the background, e.g. 10m (in place of the pair's own)")
    @argument("--stop", action="store_true",
              help="sync: stop the background sync of SRC DST (without them: every one), "
                   "after a final sync")
    @line_magic
    def mount_storage(self, line: str = "") -> Any:
        """Mount persistent storage, download data safely, and sync folders to it.

        Cloud notebook disks vanish with the session. This finds (on Colab: mounts) the
        storage that lasts and makes a project folder in it with data/, models/,
        checkpoints/, logs/ and outputs/. Downloads resume after a dropped connection
        (when the server shows the file has not changed, or a checksum will tell), are
        verified against the given checksum and appear only when complete. Archives are
        extracted without letting any member escape the target or fill the disk. Sync
        copies only what changed, atomically, and deletes nothing unless asked.

        Examples
        --------
        Mount this platform's persistent storage (Drive on Colab, /kaggle/working on
        Kaggle, ~/ipycloud elsewhere)::

            %mount_storage
            %mount_storage drive --project mnist --force

        Download into the project's data/ folder, verify and extract (the files may take
        the free space there less a margin, or what --max-total-bytes allows)::

            %mount_storage download https://example.org/data.tar.gz --sha256 9f86d0... --extract
            %mount_storage download https://example.org/big.zip --extract --max-total-bytes 200G

        A Kaggle dataset or competition's data (through kagglehub, with the credentials
        from KAGGLE_USERNAME/KAGGLE_KEY, ~/.kaggle/kaggle.json or the project folder), and
        a Google Drive file or folder shared by link (through gdown)::

            %mount_storage kaggle zynicide/wine-reviews
            %mount_storage kaggle titanic --competition
            %mount_storage gdrive https://drive.google.com/file/d/1AbC.../view --sha256 9f86d0...

        Copy results to persistent storage now, or every 10 minutes in the background (one
        background sync per pair of folders: starting it again changes its options), and
        stop it, or every one, after a final sync::

            %mount_storage sync outputs /content/drive/MyDrive/ipycloud/default/outputs
            %mount_storage sync outputs /content/drive/MyDrive/runs --every 10m
            %mount_storage sync outputs /content/drive/MyDrive/runs --stop
            %mount_storage sync --stop

        See what is mounted, the free space, the background syncs, and the final syncs that
        failed as a kernel exited (on this machine, until a sync of their folders succeeds)::

            %mount_storage status
        """
        args = parse_line(self.mount_storage, line)
        from ipycloud.runtime.messages import in_words
        from ipycloud.runtime.storage.download import DownloadError
        from ipycloud.runtime.storage.extract import UnsafeArchiveError
        from ipycloud.runtime.storage.gdrive import GdriveError
        from ipycloud.runtime.storage.kaggle_credentials import KaggleError
        from ipycloud.runtime.storage.mount import MountError

        use = ("kaggle download" if args.action == "kaggle" and args.operands else
               "sync --stop" if args.action == "sync" and args.stop else
               "mount" if args.action in MOUNT_KINDS else args.action)
        refuse_options(self.mount_storage, args, OPTIONS[use], use)
        actions = {"mount": self._mount, "kaggle download": self._kaggle, "gdrive": self._gdrive,
                   "download": self._download, "sync": self._sync,
                   "sync --stop": self._stop_syncs, "status": self._status}
        try:
            return actions[use](args)
        except (DownloadError, UnsafeArchiveError, KaggleError, GdriveError) as error:
            raise DownloadFailed(f"%mount_storage {args.action}: "
                                 f"{in_words(error, SPELLINGS)}") from None
        except NotADirectoryError as error:  # a file where --dest names a folder
            raise UsageError(f"%mount_storage {args.action}: {in_words(error, SPELLINGS)}; "
                             "give a folder with --dest") from None
        except (ValueError, OSError, ImportError, MountError) as error:
            raise UsageError(f"%mount_storage {args.action}: "
                             f"{in_words(error, SPELLINGS)}") from None

    def _mount(self, args: argparse.Namespace) -> Any:
        from ipycloud.runtime.storage.mount import mount

        _expect(args.operands, 0, "%mount_storage [auto|drive|kaggle|local] [--project P]")
        return mount(args.action, project=args.project, force=args.force)

    def _download(self, args: argparse.Namespace) -> Notice:
        from ipycloud.runtime.storage.download import download
        from ipycloud.runtime.storage.extract import extract
        from ipycloud.runtime.storage.mount import data_folder

        (url,) = _expect(args.operands, 1, "%mount_storage download URL [--sha256 H]")
        if args.max_total_bytes is not None and not args.extract:
            raise UsageError("%mount_storage download: --max-total-bytes goes with --extract")
        folder = Path(args.dest) if args.dest else data_folder()
        result = download(url, folder, sha256=args.sha256, md5=args.md5)
        text = (f"{result.path} is already present and valid" if result.skipped else
                f"downloaded {result.path} ({result.size} bytes, sha256 {result.sha256[:12]}…)")
        if args.extract:  # extract refuses what is not an archive before writing anything
            report = extract(result.path, folder / _stem(result.path.name),
                             max_total_bytes=args.max_total_bytes)
            text += f"; extracted {counted(report.extracted, 'file')} into {report.target}"
            if report.refused:
                text += f", refused {len(report.refused)}: {'; '.join(report.refused)}"
        return Notice(text)

    def _kaggle(self, args: argparse.Namespace) -> Any:
        from ipycloud.runtime.storage.kaggle import kaggle_download

        (handle,) = _expect(args.operands, 1,
                            "%mount_storage kaggle OWNER/DATASET [--competition] [--force]")
        return kaggle_download(handle, args.dest, competition=args.competition,
                               force=args.force)

    def _gdrive(self, args: argparse.Namespace) -> Any:
        from ipycloud.runtime.storage.gdrive import gdrive_download

        (link,) = _expect(args.operands, 1, "%mount_storage gdrive ID_OR_LINK [--sha256 H]")
        return gdrive_download(link, args.dest, sha256=args.sha256, md5=args.md5,
                               force=args.force)

    def _sync(self, args: argparse.Namespace) -> Any:
        from ipycloud.runtime.storage.failed_syncs import failure_of
        from ipycloud.runtime.storage.periodic_sync import BackgroundSync
        from ipycloud.runtime.storage.sync import sync

        source, target = (expand_home(folder) for folder in
                          _expect(args.operands, 2,
                                  "%mount_storage sync SRC DST [--every 10m | --stop]"))
        options = {"delete": args.delete, "checksum": args.checksum}
        if not args.every:
            return sync(source, target, dry_run=args.dry_run, **options)
        if args.dry_run:
            raise ValueError("--dry-run and --every do not go together")
        background = BackgroundSync(source, target, args.every, **options)
        earlier = failure_of(background.src, background.dst)  # before its first run forgets it
        background.start()
        instead = ("" if background.replaced is None else
                   f" (in place of the one {_pace(background.replaced)})")
        text = (f"syncing {_pair(background)} {_pace(background)} in the background{instead}, "
                "and once more when the kernel exits")
        return Notice(text if earlier is None else f"{text}\n{earlier.made_up()}")

    def _stop_syncs(self, args: argparse.Namespace) -> Notice:
        from ipycloud.runtime.messages import describe_error
        from ipycloud.runtime.storage.periodic_sync import background_sync_of, running_syncs

        operands = [expand_home(folder) for folder in
                    _expect(args.operands, (0, 2), "%mount_storage sync [SRC DST] --stop")]
        chosen = running_syncs()
        if operands:
            found = background_sync_of(*operands)
            if found is None:
                source, target = (str(Path(folder).resolve()) for folder in operands)
                raise ValueError(f"no background sync of {source!r} -> {target!r} is running "
                                 "(see %mount_storage status)")
            chosen = [found]
        if not chosen:
            return Notice("no background sync is running")
        stopped, failed = [], []
        for background in chosen:
            with contextlib.suppress(Exception):  # an earlier run's error: the final run tells
                background.stop(final=False)
            try:
                report = background.sync_now()
            except Exception as error:
                failed.append(f"the final sync of {_pair(background)} failed: "
                              f"{describe_error(error)}; run "
                              f"{_sync_line(background.src, background.dst)}")
            else:
                stopped.append(f"stopped the background sync {_pair(background)} after a "
                               f"final sync: {report.summary()}")
        if failed:
            raise UsageError(f"%mount_storage sync: stopped "
                             f"{counted(len(chosen), 'background sync')}, "
                             f"but {'; '.join(failed)}")
        return Notice("\n".join(stopped))

    def _status(self, args: argparse.Namespace) -> Notice:
        from ipycloud.runtime.storage.failed_syncs import failed_syncs
        from ipycloud.runtime.storage.mount import last_mount
        from ipycloud.runtime.storage.periodic_sync import running_syncs
        from ipycloud.runtime.units import format_bytes

        _expect(args.operands, 0, "%mount_storage status")
        mounted = last_mount()
        lines = [str(mounted) if mounted else
                 "nothing mounted in this session: run %mount_storage"]
        if mounted is not None:
            free = shutil.disk_usage(mounted.project).free
            lines.append(f"free space there: {format_bytes(free)}")
        lines += [f"background sync: {sync}" for sync in running_syncs()]
        lines += [f"failed final sync: {failure.describe(_sync_line(failure.src, failure.dst))}"
                  for failure in failed_syncs()]
        return Notice("\n".join(lines))


def _expect(operands: list[str], count: int | tuple[int, ...], usage: str) -> list[str]:
    counts = count if isinstance(count, tuple) else (count,)
    if len(operands) not in counts:
        got = shlex.join(operands) or "nothing"
        expected = " or ".join(str(number) for number in counts)
        noun = "argument" if counts == (1,) else "arguments"
        raise UsageError(f"%mount_storage: expected {expected} {noun}, got {got}; usage: "
                         f"{usage}")
    return operands


def _pair(background: BackgroundSync) -> str:
    """``'/content/outputs' -> '/content/drive/MyDrive/outputs'``."""
    return f"{str(background.src)!r} -> {str(background.dst)!r}"


def _pace(background: BackgroundSync) -> str:
    """``every 10 min``, then the options that change what a run does: ``with --delete``."""
    from ipycloud.runtime.units import format_seconds

    flags = [f"--{name}" for name in ("delete", "checksum") if background.options.get(name)]
    pace = f"every {format_seconds(background.every_s)}"
    return f"{pace} with {' '.join(flags)}" if flags else pace


def _sync_line(source: str | Path, target: str | Path) -> str:
    """The line that syncs ``source`` to ``target`` once, each quoted as the magic reads it."""
    return f"%mount_storage sync {shlex.quote(str(source))} {shlex.quote(str(target))}"


def _stem(name: str) -> str:
    """The folder name an archive extracts into: its name without archive suffixes."""
    for suffix in (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".zip", ".tar"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name + ".d"
