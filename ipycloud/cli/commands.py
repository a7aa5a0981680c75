"""What each ``ipycloud`` subcommand does: call the runtime, print its result.

A handler returns the exit status; what the runtime cannot do becomes a CommandError, one
line for stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from pathlib import Path

from ipycloud.runtime.messages import in_words, one_line

# The export's parameters as its command line names them.
EXPORT_OPTIONS = {"folder": "--folder", "bucket": "--bucket", "nodes": "--nodes",
                  "accelerators": "--accelerators", "data": "--data",
                  "max_restarts": "--max-restarts", "name": "--name", "train": "SCRIPT",
                  "args": "ARGS"}


class CommandError(Exception):
    """What a command could not do, in one line (exit status 1)."""


def info(args: argparse.Namespace) -> int:
    """``ipycloud info``: the environment report, as text or JSON."""
    from ipycloud.runtime.machine.report import environment_report

    report = environment_report(processes=args.processes)
    print(report.to_json() if args.json else report)
    return 0


def torchrun(args: argparse.Namespace) -> int:
    """``ipycloud torchrun ARGS``: torchrun, whose restarts never hang (``train.elastic``)."""
    from ipycloud.runtime._optional import require
    from ipycloud.runtime.train.elastic import torchrun as run_torchrun

    try:
        require("torch", "torch")
    except ImportError as error:
        raise CommandError(str(error)) from None
    return run_torchrun(args.arguments)


def demo(args: argparse.Namespace) -> int:
    """``ipycloud demo``: what ipycloud does, on this machine."""
    from ipycloud.cli.demo import run_demo

    return run_demo()


def checkpoint_list(args: argparse.Namespace) -> int:
    """``ipycloud checkpoint list FOLDER``: the table ``%checkpoint list`` shows, or JSON."""
    try:
        from ipycloud.runtime.checkpoint import CheckpointError, CheckpointManager
        from ipycloud.runtime.durable import refuse_a_file

        refuse_a_file(args.folder)
        table = CheckpointManager(args.folder).table()
    except (ImportError, CheckpointError, OSError) as error:
        raise CommandError(one_line(error)) from None
    if not args.json:
        print(table)
        return 0
    checkpoints = [{**info.to_manifest(), "status": info.status,
                    "directory": str(info.directory)} for info in table.infos]
    latest = None if table.latest is None else table.latest.name
    print(json.dumps({"directory": str(table.directory), "latest": latest,
                      "checkpoints": checkpoints}, indent=2))
    return 0


def runs(args: argparse.Namespace) -> int:
    """``ipycloud runs [FOLDER]``: the runs recorded in a checkpoint folder, or every run
    started or followed on this machine, newest first, as a table or JSON; with
    ``--follow``, one run of FOLDER followed until it ends."""
    from ipycloud.runtime.runs import RunsTable
    from ipycloud.runtime.runs import runs as read_runs

    if args.follow or args.run is not None:
        return _follow(args)
    try:
        summaries = read_runs(args.folder)
    except OSError as error:
        raise CommandError(one_line(error)) from None
    if args.json:  # strict JSON: a number that is not finite is null
        print(json.dumps({"runs": [summary.to_json() for summary in summaries]}, indent=2,
                         allow_nan=False))
        return 0
    where = "on this machine" if args.folder is None else f"in {args.folder}"
    print(RunsTable(summaries, where, base=None if args.folder is None else Path(args.folder)))
    return 0


def _follow(args: argparse.Namespace) -> int:
    """``ipycloud runs FOLDER --follow [--run ID]``: 0 when the run finished or stopped
    early, 1 when it ended otherwise, 130 when interrupted."""
    from ipycloud.runtime.runs import UnknownRunError
    from ipycloud.runtime.runs.follow_run import FollowStopped, follow_run
    from ipycloud.runtime.train.callback import FINISHED, STOPPED_EARLY

    if not args.follow:
        args.mistake("--run ID goes with --follow")
    if args.folder is None:
        args.mistake("--follow needs FOLDER, the checkpoint folder the run is recorded in")
    if args.json:
        args.mistake("--follow prints lines as the run goes: leave out --json")
    try:
        summary = follow_run(args.folder, args.run)
    except (OSError, UnknownRunError) as error:
        raise CommandError(one_line(error)) from None
    except FollowStopped:
        return 128 + signal.SIGINT
    return 0 if summary.status in (FINISHED, STOPPED_EARLY) else 1


def sync(args: argparse.Namespace) -> int:
    """``ipycloud sync SRC DST``: copy what changed; with ``--dry-run``, list what would."""
    from ipycloud.runtime.storage.sync import sync as sync_folders

    try:
        report = sync_folders(args.source, args.target, delete=args.delete,
                              checksum=args.checksum, dry_run=args.dry_run,
                              progress=sys.stderr.isatty())
    except (ValueError, OSError) as error:
        raise CommandError(one_line(error)) from None
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
        return 0
    if report.dry_run:
        for verb, paths in (("copy", report.copied), ("update", report.updated),
                            ("delete", report.deleted), ("skip", report.skipped)):
            for path in paths:
                print(f"would {verb} {path}")
    print(report)
    return 0


def cluster_export(args: argparse.Namespace) -> int:
    """``ipycloud cluster export [options] SCRIPT [ARGS...]``: write a SkyPilot task that
    trains SCRIPT on a cluster; the last line says how to launch it."""
    from ipycloud.runtime.cluster import ExportError, export

    mounts = dict(args.data)
    if len(mounts) < len(args.data):
        raise CommandError("--data: a mount path is given twice")
    try:
        task = export(args.script, folder=args.folder, bucket=args.bucket, nodes=args.nodes,
                      accelerators=args.accelerators, data=mounts, args=args.script_args,
                      max_restarts=args.max_restarts, use_spot=args.spot,
                      name=args.task_name)
    except ExportError as error:
        raise CommandError(in_words(error, EXPORT_OPTIONS)) from None
    except OSError as error:
        raise CommandError(one_line(error)) from None
    print(task)
    return 0
