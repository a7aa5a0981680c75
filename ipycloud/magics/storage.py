"""``%mount_storage``: persistent project folders, verified downloads, safe extraction, sync."""

from __future__ import annotations

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
    user_path,
)
from ipycloud.magics._display import Notice

if TYPE_CHECKING:
    import argparse

MOUNT_KINDS = ("auto", "drive", "kaggle", "local")
ACTIONS = (*MOUNT_KINDS, "gdrive", "download", "sync", "status")
# The options each use of the magic takes; any other option given is refused.
OPTIONS = {
    "mount": {"project", "force"},
    "kaggle download": {"competition", "force", "dest"},
    "gdrive": {"force", "dest", "sha256", "md5"},
    "download": {"dest", "sha256", "md5", "extract"},
    "sync": {"delete", "checksum", "dry_run", "every"},
    "status": set(),
}


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
    @argument("--delete", action="store_true", help="sync: delete what SRC no longer has")
    @argument("--checksum", action="store_true", help="sync: compare contents, not mtimes")
    @argument("--dry-run", action="store_true", help="sync: show what would change")
    @argument("--every", type=duration, help="sync: repeat in the background, e.g. 10m")
    @line_magic
    def mount_storage(self, line: str = "") -> Any:
        """Mount persistent storage, download data safely, and sync folders to it.

        Cloud notebook disks vanish with the session. This finds (on Colab: mounts) the
        storage that lasts and makes a project folder in it with data/, models/,
        checkpoints/, logs/ and outputs/. Downloads resume after a dropped connection,
        are verified against the given checksum and appear only when complete. Archives
        are extracted without letting any member escape the target. Sync copies only what
        changed, atomically, and deletes nothing unless asked.

        Examples
        --------
        Mount this platform's persistent storage (Drive on Colab, /kaggle/working on
        Kaggle, ~/ipycloud elsewhere)::

            %mount_storage
            %mount_storage drive --project mnist --force

        Download into the project's data/ folder, verify and extract::

            %mount_storage download https://example.org/data.tar.gz --sha256 9f86d0... --extract

        A Kaggle dataset or competition's data (through kagglehub, with the credentials
        from KAGGLE_USERNAME/KAGGLE_KEY, ~/.kaggle/kaggle.json or the project folder), and
        a Google Drive file or folder shared by link (through gdown)::

            %mount_storage kaggle zynicide/wine-reviews
            %mount_storage kaggle titanic --competition
            %mount_storage gdrive https://drive.google.com/file/d/1AbC.../view --sha256 9f86d0...

        Copy results to persistent storage now, or every 10 minutes in the background::

            %mount_storage sync outputs /content/drive/MyDrive/ipycloud/default/outputs
            %mount_storage sync outputs /content/drive/MyDrive/runs --every 10m

        See what is mounted, the free space, and the background syncs::

            %mount_storage status
        """
        args = parse_line(self.mount_storage, line)
        from ipycloud.runtime.messages import ParameterError, one_line
        from ipycloud.runtime.storage.download import DownloadError
        from ipycloud.runtime.storage.extract import UnsafeArchiveError
        from ipycloud.runtime.storage.gdrive import GdriveError
        from ipycloud.runtime.storage.kaggle_credentials import KaggleError
        from ipycloud.runtime.storage.mount import MountError

        use = ("kaggle download" if args.action == "kaggle" and args.operands else
               "mount" if args.action in MOUNT_KINDS else args.action)
        refuse_options(self.mount_storage, args, OPTIONS[use], use)
        actions = {"mount": self._mount, "kaggle download": self._kaggle, "gdrive": self._gdrive,
                   "download": self._download, "sync": self._sync, "status": self._status}
        try:
            return actions[use](args)
        except ParameterError as error:
            text = error.in_words_of({"competition": "--competition"})
            raise UsageError(f"%mount_storage {args.action}: {text}") from None
        except (ValueError, OSError, ImportError, MountError, DownloadError, UnsafeArchiveError,
                KaggleError, GdriveError) as error:
            raise UsageError(f"%mount_storage {args.action}: {one_line(error)}") from None

    def _mount(self, args: argparse.Namespace) -> Any:
        from ipycloud.runtime.storage.mount import mount

        _expect(args.operands, 0, "%mount_storage [auto|drive|kaggle|local] [--project P]")
        return mount(args.action, project=args.project, force=args.force)

    def _download(self, args: argparse.Namespace) -> Notice:
        from ipycloud.runtime.storage.download import download
        from ipycloud.runtime.storage.extract import extract
        from ipycloud.runtime.storage.mount import data_folder

        (url,) = _expect(args.operands, 1, "%mount_storage download URL [--sha256 H]")
        folder = Path(args.dest) if args.dest else data_folder()
        result = download(url, folder, sha256=args.sha256, md5=args.md5)
        text = (f"{result.path} is already present and valid" if result.skipped else
                f"downloaded {result.path} ({result.size} bytes, sha256 {result.sha256[:12]}…)")
        if args.extract:  # extract refuses what is not an archive before writing anything
            report = extract(result.path, folder / _stem(result.path.name))
            text += f"; extracted {report.extracted} files into {report.target}"
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
        from ipycloud.runtime.storage.background import BackgroundSync
        from ipycloud.runtime.storage.sync import sync
        from ipycloud.runtime.units import format_seconds

        source, target = (expand_home(folder) for folder in
                          _expect(args.operands, 2, "%mount_storage sync SRC DST"))
        options = {"delete": args.delete, "checksum": args.checksum}
        if args.every:
            if args.dry_run:
                raise ValueError("--dry-run and --every do not go together")
            BackgroundSync(source, target, args.every, **options).start()
            return Notice(f"syncing {source} to {target} every {format_seconds(args.every)} "
                          "in the background, and once more when the kernel exits")
        return sync(source, target, dry_run=args.dry_run, **options)

    def _status(self, args: argparse.Namespace) -> Notice:
        from ipycloud.runtime.storage.background import running_syncs
        from ipycloud.runtime.storage.mount import last_mount
        from ipycloud.runtime.units import format_bytes

        _expect(args.operands, 0, "%mount_storage status")
        mounted = last_mount()
        lines = [str(mounted) if mounted else
                 "nothing mounted in this session: run %mount_storage"]
        if mounted is not None:
            free = shutil.disk_usage(mounted.project).free
            lines.append(f"free space there: {format_bytes(free)}")
        lines += [f"background sync: {sync}" for sync in running_syncs()]
        return Notice("\n".join(lines))


def _expect(operands: list[str], count: int, usage: str) -> list[str]:
    if len(operands) != count:
        got = " ".join(operands) or "nothing"
        raise UsageError(f"%mount_storage: expected {count} argument(s), got {got}; usage: "
                         f"{usage}")
    return operands


def _stem(name: str) -> str:
    """The folder name an archive extracts into: its name without archive suffixes."""
    for suffix in (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".zip", ".tar"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name + ".d"
