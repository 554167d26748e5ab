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

A setting that can also come from a config file declares its range once, as
:class:`Bounds` in its dataclass field's metadata (:func:`bounded`): the
file's loader checks it (:func:`check_bounds`) and the flag parses with the
very same bounds (:func:`bounds_of` then :meth:`Bounds.flag_type`), so a value
the flag refuses is never accepted from the file, and the error names the
setting, where the value came from and the bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


# The key of a dataclass field's metadata that holds its Bounds.
BOUNDS = "gpuwarden.bounds"


@dataclass(frozen=True, slots=True)
class Bounds:
    """The range of one numeric setting: finite, above ``low`` (or at it) and at most ``high``.

    ``integer`` settings (counts, levels) take whole numbers only. Declared
    once per setting and checked wherever its value comes from (flag,
    environment variable, config file), so the sources cannot disagree.
    """

    low: float = 0.0
    high: float = MAX_SECONDS
    allow_low: bool = False
    integer: bool = False

    def describe(self) -> str:
        kind = "a whole number" if self.integer else "a finite number"
        low = f"at least {self.low:g}" if self.allow_low else f"greater than {self.low:g}"
        return f"must be {kind} {low} and at most {self.high:g}"

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of bounds, or None when it is within them."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"{self.describe()}, got {value!r}"
        above = value >= self.low if self.allow_low else value > self.low
        if not above or value > self.high:
            return f"{self.describe()}, got {brief(value)}"
        return None

    def flag_type(self, what: str = "number") -> Callable[[str], Any]:
        """An argparse type that reads a flag's text and applies these bounds."""
        bounds = self

        def parse(text: str) -> float | int:
            try:
                if bounds.integer:
                    if not (text.isascii() and text.strip().lstrip("-").isdigit()):
                        raise ValueError(text)
                    value: float | int = int(text)
                else:
                    value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not a {what}: {brief(text)}") from None
            problem = bounds.problem(value)
            if problem is not None:
                # The text as given: "1e999" reads better than "inf".
                raise argparse.ArgumentTypeError(f"{problem.rsplit(', got ', 1)[0]}, got {brief(text)}")
            return value

        parse.__name__ = what  # argparse names the type in its own messages
        return parse


def bounded(default: float | None, bounds: Bounds) -> Any:
    """A dataclass field with ``default`` whose value must lie within ``bounds`` (see :func:`check_bounds`)."""
    return dataclasses.field(default=default, metadata={BOUNDS: bounds})


def bounds_of(cls: type[Any], name: str) -> Bounds:
    """The bounds declared on field ``name`` of dataclass ``cls``: what its flag parses with."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            found = f.metadata.get(BOUNDS)
            if isinstance(found, Bounds):
                return found
            raise KeyError(f"{cls.__name__}.{name} declares no bounds")
    raise KeyError(f"{cls.__name__} has no field {name}")


def check_bounds(obj: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted key, problem)`` for each bounded field of dataclass ``obj`` whose value is out of range.

    Nested dataclasses (and lists of them) are checked too, their keys dotted
    (``pcie.window_s``, ``storage.mounts[0].timeout_s``). None is no value,
    not out of range.
    """
    found: list[tuple[str, str]] = []
    for f in dataclasses.fields(obj):
        key = f"{prefix}.{f.name}" if prefix else f.name
        bounds = f.metadata.get(BOUNDS)
        value = getattr(obj, f.name)
        if isinstance(bounds, Bounds) and value is not None:
            problem = bounds.problem(value)
            if problem is not None:
                found.append((key, problem))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            found.extend(check_bounds(value, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    found.extend(check_bounds(item, f"{key}[{i}]"))
    return found


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)``, shortened to about ``limit`` characters: an error message stays one line.

    A value from a file can be anything (a list of a million items, a string
    of a megabyte); its whole repr in an error would bury the reason.
    """
    text = _short_repr(value, limit)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short_repr(value: object, limit: int) -> str:
    # Never build the repr of a nested or big collection: an alias bomb makes
    # that exponential. A few scalars are shown; anything else is described.
    if isinstance(value, str | bytes) and len(value) > limit:
        return repr(value[:limit])
    if isinstance(value, Mapping | list | tuple):
        items = list(value.items()) if isinstance(value, Mapping) else list(value)
        flat = [v for item in items for v in (item if isinstance(value, Mapping) else (item,))]
        if len(items) > 8 or any(isinstance(v, Mapping | list | tuple | set) for v in flat):
            kind = "mapping" if isinstance(value, Mapping) else "list"
            return f"<a {kind} of {len(items)} {'keys' if kind == 'mapping' else 'items'}>"
    return repr(value)


def number(
    low: float = 0.0, high: float = MAX_SECONDS, *, allow_low: bool = False, what: str = "number"
) -> Callable[[str], float]:
    """An argparse type for a finite number above ``low`` (or at it, with ``allow_low``) and at most ``high``."""
    parse: Callable[[str], float] = Bounds(low, high, allow_low=allow_low).flag_type(what)
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
