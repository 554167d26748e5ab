"""The ``gpuwarden`` console script: one binary, one subcommand per process.

Subcommands register themselves: each package names its registrar, a
``register(subparsers)`` function that adds one or more subcommands, under
the ``gpuwarden.commands`` entry-point group in ``pyproject.toml``. The core
therefore imports neither the agent nor the scheduler, and an install that
lacks one of them still gets a working command for the other. Those modules keep their heavy imports
(kubernetes, pynvml) inside the functions that run, so parsing flags stays
cheap for every subcommand.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

from gpuwarden import __version__
from gpuwarden.flags import FlagError, add_flag
from gpuwarden.logconfig import configure_logging

COMMAND_GROUP = "gpuwarden.commands"

Register = Callable[[Any], None]


def registered_commands() -> list[tuple[str, Register]]:
    """The registrars installed, by entry-point name, in a stable order for ``--help``.

    An entry point whose own package is not installed is skipped (its
    subcommands are then absent from ``--help``); any other import error is a
    bug in that package and propagates.
    """
    found = []
    for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name):
        try:
            found.append((ep.name, ep.load()))
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".", 1)[0] != ep.module.split(".", 1)[0]:
                raise
    return found


def build_parser(commands: Sequence[tuple[str, Register]] | None = None) -> argparse.ArgumentParser:
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
    for _name, register in commands if commands is not None else registered_commands():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None, commands: Sequence[tuple[str, Register]] | None = None) -> int:
    """Run the command line; ``commands`` replaces the installed registrars (``python -m demo``)."""
    try:
        parser = build_parser(commands)
    except FlagError as exc:
        # The same usage error, and exit status 2, as a bad value on the command line.
        argparse.ArgumentParser(prog="gpuwarden").error(str(exc))
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_format, args.log_level)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        result: int = args.func(args)
    except FlagError as exc:
        # Flags checked together (a combination that cannot work) fail the same way.
        parser.error(str(exc))
    return result


if __name__ == "__main__":
    sys.exit(main())
