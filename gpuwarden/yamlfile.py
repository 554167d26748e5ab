"""Reading a YAML document that a person wrote: one loader for every file gpuwarden reads.

The agent's config, the simulator's scenarios and the scheduler's snapshots
are all hand-edited, so a missing file and a syntax error must both name the
file and what kind of file it is, and must surface as the caller's own error
type (the CLI turns those into one clear line, not a traceback); so must a
file that is not UTF-8 text (a Latin-1 name pasted into a config), which
YAML cannot read; and so must a key given twice in one mapping, which YAML
would resolve silently by position. Only the safe loader: these files never
carry Python objects.

A file is refused before it can cost the process: at most ``max_bytes``
are read (``--config /dev/zero`` or a FIFO would otherwise fill memory), and
a document with too many aliases, too deep a nesting or too many nodes once
its aliases are expanded (a kilobyte "billion laughs" expands to millions) is
an error, not a structure that every later step walks again. Errors stay
short: a YAML error quotes a snippet of the file, never the whole of it.

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

# What a hand-written file may be. A config file is a few kilobytes and a
# snapshot of thousands of nodes a few megabytes; a formats that needs more
# passes its own max_bytes.
MAX_BYTES = 4 * 1024 * 1024
# Aliases (``*name``) in one document: merge keys (``<<: *defaults``) use a
# few; hundreds are a bomb, not a config.
MAX_ALIASES = 100
# Nesting of mappings and lists. The deepest format (a snapshot) nests about
# six; the limit also keeps the composer's recursion far from Python's.
MAX_DEPTH = 32
# Values that aliases may add to a document once expanded: what the formats'
# readers walk, beyond what the file itself spells out. A merge key adds a
# handful; a kilobyte "billion laughs" adds hundreds of millions.
MAX_EXPANSION = 100_000
# The longest error message this module writes.
MAX_MESSAGE = 400


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


class _LimitPassed(yaml.YAMLError):
    """A document beyond one of this module's limits: well-formed, perhaps, but refused."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        super().__init__(f"{problem}{where}")


class _BoundedLoader(_UniqueKeyLoader):
    """The unique-key loader that refuses too many aliases, too deep a nesting and too many nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _LimitPassed(f"more than {MAX_ALIASES} aliases in one document", self._mark())
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _LimitPassed(f"nested more than {MAX_DEPTH} levels deep", self._mark())
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _mark(self) -> yaml.Mark | None:
        """Where the next event starts, for the error."""
        event = self.peek_event()  # type: ignore[no-untyped-call]
        mark: yaml.Mark | None = event.start_mark
        return mark

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            sizes: dict[int, int] = {}
            if _expanded_size(node, sizes) - len(sizes) > MAX_EXPANSION:
                raise _LimitPassed(f"its aliases expand to more than {MAX_EXPANSION} values", node.start_mark)
        return node


# Beyond any document's real size; keeps a bomb's counts small integers.
_SIZE_CAP = 10**12


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Values under ``node``, an alias counted as often as it is used (each node's size computed once).

    ``sizes`` ends up with one entry per distinct node: the document as spelt.
    """
    known = sizes.get(id(node))
    if known is not None:
        return known
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    sizes[id(node)] = total = min(total, _SIZE_CAP)
    return total


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def parse_yaml(text: str, source: str, error: type[Exception]) -> Any:
    """The document in ``text``; a syntax error, a repeated key or a limit passed raises ``error`` naming ``source``."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader subclass
    except _LimitPassed as exc:
        raise error(_short(f"{source} is refused: {exc}")) from exc
    except yaml.YAMLError as exc:
        raise error(_short(f"{source} is not valid YAML: {exc}")) from exc
    except ValueError as exc:
        # An integer of thousands of digits: int() refuses it (Python's digit limit).
        raise error(_short(f"{source} is not valid YAML: {exc}")) from exc


def load_yaml(path: str | Path, what: str, error: type[Exception], *, max_bytes: int = MAX_BYTES) -> Any:
    """The document in the file ``path``, a ``what`` ("config file", "snapshot", ...).

    An unreadable file, one larger than ``max_bytes``, or a syntax error
    raises ``error`` with the path and the reason, so every caller reports
    them the same way. At most ``max_bytes + 1`` bytes are read, so a device
    or a pipe that never ends costs no more than a file that is too big.
    """
    p = Path(path)
    try:
        with p.open("rb") as stream:
            raw = stream.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from exc
    if len(raw) > max_bytes:
        raise error(f"{what} {p} is larger than {max_bytes} bytes, the most a {what} may be")
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
