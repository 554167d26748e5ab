"""The ``gpuwarden`` console script: one binary, one subcommand per process.

Subcommands register themselves (``register(subparsers)`` in their module);
those modules keep their heavy imports (kubernetes, pynvml) inside the
functions that run, so parsing flags stays cheap for every subcommand.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agent import __version__
from agent import main as agent_main
from agent.cliutil import add_flag
from agent.logconfig import configure_logging
from scheduler import cli as scheduler_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        description="Keep GPU clusters on Kubernetes healthy and fully used.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    add_flag(
        parser,
        "--log-format",
        choices=["auto", "json", "console"],
        default="auto",
        help="log output: JSON lines, human console text, or auto (console on a terminal, JSON otherwise)",
    )
    add_flag(parser, "--log-level", default="info", help="minimum level logged: debug, info, warning, error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    agent_main.register(sub)
    scheduler_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_format, args.log_level)
    except ValueError as exc:
        parser.error(str(exc))
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
