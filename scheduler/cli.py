"""``gpuwarden scheduler`` and ``gpuwarden fairshare`` subcommands."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("scheduler", help="run the gpuwarden scheduler")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("gpuwarden scheduler: not built yet")
