"""Reading a YAML document that a person wrote: one loader for every file gpuwarden reads.

The agent's config, the simulator's scenarios and the scheduler's snapshots
are all hand-edited, so a missing file and a syntax error must both name the
file and what kind of file it is, and must surface as the caller's own error
type (the CLI turns those into one clear line, not a traceback); so must a
file that is not UTF-8 text (a Latin-1 name pasted into a config), which
YAML cannot read; and so must a key given twice in one mapping, which YAML
would resolve silently by position. Only the safe loader: these files never
carry Python objects.

The formats built on it share two more rules, kept here so that they read
alike: a key the format does not know is refused and named with the closest
known one (a misspelt threshold or quota silently taking its default is the
failure that costs most), and a number is a number however YAML spelt it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping.

    PyYAML keeps the last of two equal keys without a word, so a quota pasted
    twice with different values, or a threshold set again further down a long
    file, silently wins or loses by position. Merge keys (``<<``) still work:
    what a merge brings in may be overridden, as YAML intends.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found key {key!r} a second time (first at line {first.start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str, error: type[Exception]) -> Any:
    """The document in ``text``; a syntax error or a repeated key raises ``error`` naming ``source``."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise error(f"{source} is not valid YAML: {exc}") from exc


def load_yaml(path: str | Path, what: str, error: type[Exception]) -> Any:
    """The document in the file ``path``, a ``what`` ("config file", "snapshot", ...).

    An unreadable file or a syntax error raises ``error`` with the path and
    the reason, so every caller reports both the same way.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start]
        raise error(f"{what} {p} is not UTF-8 text: byte {bad:#04x} at offset {exc.start} ({exc.reason})") from exc
    return parse_yaml(text, f"{what} {p}", error)


def unknown_keys(data: Mapping[Any, Any], known: Collection[str]) -> list[tuple[str, str]]:
    """``(key, message)`` for each key of ``data`` that is not in ``known``, in document order.

    The message suggests the closest known key ("unknown key 'limt' (did you
    mean 'limit'?)"), matched without regard to case, since a wrong case is
    the commonest typo; with nothing close it lists the known keys. Callers
    prefix the key's path and decide whether to stop at the first.
    """
    by_lower = {k.lower(): k for k in known}
    found: list[tuple[str, str]] = []
    for raw in data:
        key = str(raw)
        if key in known:
            continue
        close = difflib.get_close_matches(key.lower(), list(by_lower), n=1)
        hint = f"did you mean {by_lower[close[0]]!r}?" if close else f"known: {', '.join(sorted(known))}"
        found.append((key, f"unknown key {key!r} ({hint})"))
    return found


def yaml_number(value: Any) -> float | None:
    """``value`` as a float if it is a number, or a string that ``float()`` reads; else ``None``.

    YAML 1.1 (PyYAML) reads ``1e300`` and ``3e2``, an exponent without a dot,
    as strings, so where a number is meant a numeric string is one. ``true``
    is not a number. Whether the value is finite and in range is the
    caller's to judge, since only it can say which key was wrong and why.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an int beyond any float
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
