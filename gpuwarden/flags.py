"""Flags with environment-variable equivalents.

A DaemonSet sets configuration through env vars, a person at a terminal
through flags; both must mean the same thing, and ``--help`` must say which
variable backs each flag so nobody has to read the source at 3 a.m.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

ENV_PREFIX = "GPUWARDEN_"


def env_name(flag: str) -> str:
    """``--poll-interval`` -> ``GPUWARDEN_POLL_INTERVAL``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def add_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    *,
    help: str,
    default: Any = None,
    type: Callable[[str], Any] = str,
    choices: list[str] | None = None,
    action: str | None = None,
    required: bool = False,
) -> None:
    """Add ``flag`` whose default comes from its env var when that is set.

    ``action="store_true"`` flags read the env var as a boolean. A malformed
    env value fails at startup naming the variable, rather than silently
    falling back to the default.
    """
    env = env_name(flag)
    raw = os.environ.get(env)
    if action == "store_true":
        value = _parse_bool(raw) if raw is not None else bool(default)
        parser.add_argument(flag, action="store_true", default=value, help=f"{help} [env {env}]")
        return
    if raw is not None:
        try:
            value = type(raw)
        except (TypeError, ValueError) as exc:
            raise SystemExit(f"gpuwarden: environment variable {env}={raw!r} is invalid: {exc}") from exc
        if choices is not None and value not in choices:
            raise SystemExit(f"gpuwarden: environment variable {env}={raw!r} must be one of {choices}")
        default = value
        required = False
    shown = f" (default: {default})" if default not in (None, "") else ""
    parser.add_argument(
        flag,
        type=type,
        default=default,
        choices=choices,
        required=required,
        help=f"{help}{shown} [env {env}]",
    )
