"""The ``ipycloud`` command: the runtime from a terminal."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ipycloud._version import __version__


def _info(args: argparse.Namespace) -> int:
    from ipycloud.runtime.machine.report import environment_report

    report = environment_report(processes=args.processes)
    print(report.to_json() if args.json else report)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ipycloud.cli.demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="ipycloud", description="Make cloud notebooks a dependable place to train models.")
    parser.add_argument("--version", action="version", version=f"ipycloud {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser("info", help="report platform, CPU, RAM, disks, GPUs, software")
    info.add_argument("--json", action="store_true", help="print the full report as JSON")
    info.add_argument("-p", "--processes", action="store_true",
                      help="also list the processes using each GPU")
    info.set_defaults(handler=_info)
    demo = commands.add_parser(
        "demo", help="show what ipycloud does on this machine: report, crash-proof checkpoints")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))

