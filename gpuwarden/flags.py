"""Flags with environment-variable equivalents, and the value types they accept.

A DaemonSet sets configuration through env vars, a person at a terminal
through flags; both must mean the same thing, and ``--help`` must say which
variable backs each flag so nobody has to read the source at 3 a.m. A bad
value is refused the same way from either place: one usage error naming the
flag (and the variable), exit status 2, never a traceback.

Numbers are range-checked where they are parsed. ``float("nan")`` and
``float("inf")`` are valid Python floats, and a NaN poll interval makes a
loop that never sleeps, an infinite one a process that looks alive and does
nothing; so every numeric flag names its bounds (:func:`seconds`,
:func:`port_number`).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

ENV_PREFIX = "GPUWARDEN_"

# The longest interval or timeout any gpuwarden flag takes: a day. Anything
# longer is a typo (a unit mix-up), not a setting.
MAX_SECONDS = 86_400.0


class FlagError(Exception):
    """A flag's environment variable holds a value the flag refuses.

    Raised while the parser is built (that is when the variables are read);
    :func:`gpuwarden.cli.main` reports it as a usage error, exactly like a bad
    value on the command line.
    """


def env_name(flag: str) -> str:
    """``--poll-interval`` -> ``GPUWARDEN_POLL_INTERVAL``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean (use true or false): {text!r}")


def number(
    low: float = 0.0, high: float = MAX_SECONDS, *, allow_low: bool = False, what: str = "number"
) -> Callable[[str], float]:
    """An argparse type for a finite number above ``low`` (or at it, with ``allow_low``) and at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {what}: {text!r}") from None
        above = value >= low if allow_low else value > low
        if not math.isfinite(value) or not above or value > high:
            bound = f"{'at least' if allow_low else 'greater than'} {low:g} and at most {high:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in its own messages
    return parse


def seconds(low: float = 0.0, high: float = MAX_SECONDS, *, allow_low: bool = False) -> Callable[[str], float]:
    """An argparse type for a duration in seconds (see :func:`number`)."""
    return number(low, high, allow_low=allow_low, what="number of seconds")


def positive_int(text: str) -> int:
    """An argparse type for a count of at least 1, ASCII digits only."""
    if not (text.isascii() and text.strip().isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def port_number(text: str) -> int:
    """An argparse type for a TCP port: 0 (any free port) to 65535, ASCII digits only."""
    if not (text.isascii() and text.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    value = int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text!r}")
    return value


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
    env value raises :class:`FlagError` naming the variable, rather than
    silently falling back to the default.
    """
    env = env_name(flag)
    raw = os.environ.get(env)
    if action == "store_true":
        try:
            value = _parse_bool(raw) if raw is not None else bool(default)
        except ValueError as exc:
            raise FlagError(f"environment variable {env} (for {flag}): {exc}") from exc
        parser.add_argument(flag, action="store_true", default=value, help=f"{help} [env {env}]")
        return
    if raw is not None:
        try:
            value = type(raw)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise FlagError(f"environment variable {env} (for {flag}): {exc}") from exc
        if choices is not None and value not in choices:
            raise FlagError(f"environment variable {env} (for {flag}): {raw!r} is not one of {', '.join(choices)}")
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
