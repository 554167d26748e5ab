"""``gpuwarden agent``: the per-node health agent (flags and entry point)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("agent", help="run the per-node GPU health agent")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("gpuwarden agent: not built yet")
