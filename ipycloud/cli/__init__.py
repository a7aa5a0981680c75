"""The ``ipycloud`` command: the runtime from a terminal.

Exit status: 0 done; 1 the runtime could not do it (one line on stderr); 2 a usage mistake
(the subcommand's usage, then the mistake); 130 interrupted with Ctrl-C; 141 the reader of
the output went away (``ipycloud info --json | head -1``), as for any command ended by
SIGPIPE, without a word.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from ipycloud._version import __version__
from ipycloud.cli import commands

BROKEN_PIPE = 128 + signal.SIGPIPE
INTERRUPTED = 128 + signal.SIGINT


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser: words it does not know are its mistake, shown with its usage
    (argparse would leave them to the top-level parser and show that one's)."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="ipycloud", description="Make cloud notebooks a dependable place to train models.",
        allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"ipycloud {__version__}")
    subcommands = _subcommands(parser, "command", "COMMAND")

    info = _add(subcommands, "info", commands.info,
                "report platform, CPU, RAM, disks, GPUs, software")
    info.add_argument("--json", action="store_true", help="print the full report as JSON")
    info.add_argument("-p", "--processes", action="store_true",
                      help="also list the processes using each GPU")

    # Listed here; main() hands every word after "torchrun" to torchrun itself.
    _add(subcommands, "torchrun", commands.torchrun,
         "torch's torchrun, each group of workers with a store of its own, so that restarts "
         "and scale-downs never hang; the arguments are torchrun's")

    _add(subcommands, "demo", commands.demo,
         "show what ipycloud does on this machine: report, crash-proof checkpoints")

    checkpoint = subcommands.add_parser("checkpoint", help="the checkpoints of a folder",
                                        allow_abbrev=False)
    listing = _add(_subcommands(checkpoint, "action", "ACTION"), "list", commands.checkpoint_list,
                   "list the checkpoints of FOLDER, oldest first")
    listing.add_argument("folder", metavar="FOLDER", type=_path, help="the checkpoint folder")
    listing.add_argument("--json", action="store_true", help="print the manifests as JSON")

    runs = _add(subcommands, "runs", commands.runs,
                "list the runs of fit recorded in FOLDER, or every run started here")
    runs.add_argument("folder", metavar="FOLDER", type=_path, nargs="?", default=None,
                      help="a checkpoint folder (default: the runs started on this machine)")
    runs.add_argument("--json", action="store_true", help="print the runs as JSON")
    runs.add_argument("--follow", action="store_true",
                      help="follow the newest run of FOLDER until it ends, with a progress "
                           "line now and then; exit status 0 when it finished or stopped "
                           "early, 1 when it failed, paused or was lost")
    runs.add_argument("--run", metavar="ID", type=_run_id,
                      help="with --follow: the run to follow (default: the newest)")
    runs.set_defaults(mistake=runs.error)

    sync = _add(subcommands, "sync", commands.sync,
                "copy what is new or changed in SRC to DST; nothing at DST is deleted unless "
                "asked")
    sync.add_argument("source", metavar="SRC", type=_path, help="the folder to copy")
    sync.add_argument("target", metavar="DST", type=_path,
                      help="where it goes (made if missing)")
    sync.add_argument("--delete", action="store_true", help="delete what SRC no longer has")
    sync.add_argument("--checksum", action="store_true",
                      help="compare contents (sha256), not sizes and times")
    sync.add_argument("-n", "--dry-run", action="store_true",
                      help="list what would change and change nothing")
    sync.add_argument("--json", action="store_true", help="print the full report as JSON")

    _add_cluster(subcommands)
    return parser


def _add_cluster(subcommands: Any) -> None:
    """``ipycloud cluster export``: its options are those of ipycloud.cluster.export."""
    cluster = subcommands.add_parser("cluster", help="train on several machines",
                                     allow_abbrev=False)
    export = _add(_subcommands(cluster, "action", "ACTION"), "export", commands.cluster_export,
                  "write a SkyPilot task that trains SCRIPT on a cluster (sky jobs launch)")
    export.add_argument("--folder", required=True, type=_path,
                        help="where the task goes (a folder of its own: it is uploaded)")
    export.add_argument("--bucket", required=True, metavar="URL",
                        help="the checkpoint bucket: s3://, gs://, r2://, https://<account>"
                             ".blob.core.windows.net/<container>...")
    export.add_argument("--nodes", type=int, default=1, metavar="N",
                        help="machines (default: 1)")
    export.add_argument("--accelerators", metavar="NAME[:N]",
                        help="each node's accelerators, e.g. A100:8 (default: CPU nodes)")
    export.add_argument("--data", action="append", default=[], type=_mount,
                        metavar="PATH=SOURCE",
                        help="mount a bucket or upload a local folder at PATH on every node "
                             "(repeatable)")
    export.add_argument("--max-restarts", type=int, default=3, metavar="N",
                        help="times torchrun restarts a failed group (default: 3)")
    export.add_argument("--spot", action="store_true", help="use spot machines")
    export.add_argument("--name", dest="task_name", metavar="NAME",
                        help="the task's name (default: the script's)")
    export.add_argument("script", metavar="SCRIPT", type=_path, help="the training script")
    script_args = export.add_argument("script_args", metavar="ARGS", nargs=argparse.REMAINDER,
                                      help="the script's command line")
    script_args.required = False  # argparse counts every REMAINDER as required in its usage


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["torchrun"]:  # every word after it is torchrun's, its --help included
        return commands.torchrun(argparse.Namespace(arguments=words[1:]))
    args = build_parser().parse_args(words)
    with warnings.catch_warnings():
        warnings.showwarning = _warn_in_one_line
        try:
            status = int(args.handler(args))
            sys.stdout.flush()  # here, where a closed pipe can still be handled
        except BrokenPipeError:
            _discard_stdout()
            return BROKEN_PIPE
        except commands.CommandError as error:
            print(f"{args.name}: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"{args.name}: interrupted", file=sys.stderr)
            return INTERRUPTED
    return status


def _subcommands(parser: argparse.ArgumentParser, dest: str, metavar: str) -> Any:
    return parser.add_subparsers(dest=dest, required=True, metavar=metavar,
                                 parser_class=_Subcommand)


def _add(subcommands: Any, name: str, handler: Any, text: str) -> argparse.ArgumentParser:
    """A subcommand whose parsed arguments carry its handler and its full name."""
    parser: argparse.ArgumentParser = subcommands.add_parser(name, help=text, description=text,
                                                             allow_abbrev=False)
    parser.set_defaults(handler=handler, name=parser.prog)
    return parser


def _path(text: str) -> str:
    """An argparse type: a path, never empty (an empty one would mean this folder)."""
    if not text:
        raise argparse.ArgumentTypeError("empty path: give a folder (. for this one)")
    return text


def _run_id(text: str) -> str:
    """An argparse type: a run's id."""
    from ipycloud.runtime.runs.records import RUN_ID

    if not RUN_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is no run id: 12 hex digits, as "
                                         "ipycloud runs FOLDER lists them")
    return text


def _mount(text: str) -> tuple[str, str]:
    """An argparse type: ``PATH=SOURCE``, a mount path on the nodes and what it holds."""
    path, equals, source = text.partition("=")
    if not (path and equals and source):
        raise argparse.ArgumentTypeError(f"{text!r} is not PATH=SOURCE, like /data=s3://my-data")
    return path, source


def _warn_in_one_line(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, file: Any = None, line: str | None = None) -> None:
    print(f"ipycloud: {category.__name__}: {message}", file=sys.stderr)


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
