"""DRA device selectors: CEL over a device's attributes and capacity, as kube-scheduler evaluates them.

A DeviceClass and each request of a ResourceClaim select devices with CEL
expressions (``resource.k8s.io/v1`` ``DeviceSelector.cel.expression``) over
one variable, ``device``:

- ``device.driver``: the driver's name;
- ``device.attributes[domain].name``: the device's attributes, grouped by
  the domain of their qualified name (an attribute published without a
  domain, ``uuid``, is in the driver's: ``device.attributes["gpu.nvidia.com"].uuid``);
  values are ints, bools, strings and semantic versions;
- ``device.capacity[domain].name``: its capacities, as quantities;
- ``device.allowMultipleAllocations``: whether the device may be shared.

Kubernetes adds its CEL libraries to the environment; the ones DRA
selectors use are here: quantities (``quantity("40Gi")``, ``isQuantity``,
``compareTo``, ``isGreaterThan``, ``isLessThan``, ``add``, ``sub``,
``asInteger``, ``asApproximateFloat``, ``isInteger``, ``sign``) and
semantic versions (``semver("1.2.3")``, ``isSemver``, ``major``, ``minor``,
``patch``, ``compareTo``, ``isGreaterThan``, ``isLessThan``), and the
strings extension's ``lowerAscii``, ``upperAscii``, ``trim``, ``split``,
``replace``, ``indexOf`` and ``lastIndexOf``, and the ``sets`` extension
(``sets.contains``, ``sets.equivalent``, ``sets.intersects``, with CEL's
equality: ``1`` equals ``1.0``, ``true`` is no number), and the
``cel.bind(name, value, body)`` macro of CEL's bindings extension, which
the CEL library does not expand: :mod:`.celbind` rewrites it before
compiling. As
in Kubernetes, a domain the device has nothing of is an empty map, so
``has(device.attributes["example.com"].x)`` is false. A quantity
and a version are passed to CEL as tagged maps holding their canonical
form, so ``==`` between two of them is Kubernetes' equality (``1Gi`` equals
``1024Mi``) and ordering operators, which Kubernetes does not define on
them, are errors.

What kube-scheduler does with an expression that fails (an attribute the
device does not have, a type mismatch, a syntax error) is what this does:
the allocation is aborted with the error, never read as "does not match".
So :meth:`Selectors.matches` raises :class:`SelectorError`, whose text goes
to the pod's PodGroup.

Each distinct expression is compiled once (a syntax error is kept as its
error), and each device's verdict for an expression is kept on the device
(:class:`CelDevice`), which the inventory rebuilds only when its
ResourceSlice changes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import cel

from gpuwarden.quantity import parse_quantity
from scheduler.cluster.celbind import BindError, expand_bindings

# The tag keys of the values CEL cannot hold natively (module docstring).
_QUANTITY = "__k8s_quantity__"
_SEMVER = "__k8s_semver__"

# Semantic versions as Kubernetes parses them: major.minor.patch, optional
# pre-release and build, no leading "v", no leading zeros.
_NUMBER = r"(0|[1-9]\d*)"
_SEMVER_RE = re.compile(
    rf"^{_NUMBER}\.{_NUMBER}\.{_NUMBER}"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


class SelectorError(Exception):
    """A selector that could not be evaluated for a device: the allocation stops here, with this text."""


@dataclass(eq=False, slots=True)
class CelDevice:
    """A device as CEL sees it, and its verdicts so far (by expression: True, False or the error's text)."""

    value: Mapping[str, Any]
    verdicts: dict[str, bool | str] = field(default_factory=dict)
    # The CEL context with ``value`` and the functions, made on the first evaluation and reused.
    context: Any = None


def quantity_value(text: object) -> dict[str, str]:
    """A quantity for CEL; raises SelectorError when it is not one."""
    amount = parse_quantity(text)
    if isinstance(amount, str):
        raise SelectorError(amount)
    return {_QUANTITY: f"{amount.numerator}/{amount.denominator}"}


def semver_value(text: object) -> dict[str, str]:
    """A semantic version for CEL; raises SelectorError when it is not one."""
    if not isinstance(text, str) or _SEMVER_RE.match(text) is None:
        raise SelectorError(f"{text!r} is not a semantic version")
    return {_SEMVER: text}


def device_value(driver: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """``device`` for one device of a ResourceSlice (``spec.devices[]``) of ``driver``.

    An attribute or capacity whose value cannot be read is left out, so a
    selector that names it fails as on a device without it.
    """
    attributes: dict[str, dict[str, Any]] = {}
    raw = entry.get("attributes")
    for name, attr in raw.items() if isinstance(raw, dict) else ():
        value = _attribute(attr)
        if value is None or not isinstance(name, str):
            continue
        domain, sep, short = name.rpartition("/")
        attributes.setdefault(domain if sep else driver, {})[short if sep else name] = value
    capacity: dict[str, dict[str, Any]] = {}
    raw = entry.get("capacity")
    for name, cap in raw.items() if isinstance(raw, dict) else ():
        if not isinstance(name, str) or not isinstance(cap, dict):
            continue
        try:
            value = quantity_value(cap.get("value"))
        except SelectorError:
            continue
        domain, sep, short = name.rpartition("/")
        capacity.setdefault(domain if sep else driver, {})[short if sep else name] = value
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": entry.get("allowMultipleAllocations") is True,
    }


def _attribute(attr: object) -> object:
    if not isinstance(attr, dict) or len(attr) != 1:
        return None
    ((kind, value),) = attr.items()
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "version" and isinstance(value, str):
        try:
            return semver_value(value)
        except SelectorError:
            return None
    return None


# -- the Kubernetes CEL functions, over the tagged values ---------------------


def _q(value: object, what: str = "receiver") -> Fraction:
    if isinstance(value, dict) and _QUANTITY in value:
        return Fraction(value[_QUANTITY])
    if isinstance(value, int) and not isinstance(value, bool) and what == "operand":
        return Fraction(value)
    raise SelectorError(f"{what} is not a quantity: {value!r}")


def _v(value: object) -> tuple[int, int, int, tuple[tuple[int, int | str], ...] | None]:
    if not isinstance(value, dict) or _SEMVER not in value:
        raise SelectorError(f"not a semantic version: {value!r}")
    match = _SEMVER_RE.match(value[_SEMVER])
    assert match is not None
    pre = match.group(4)
    # A pre-release orders before its release; identifiers compare numerically where numeric.
    parts = None if pre is None else tuple((0, int(p)) if p.isdigit() else (1, p) for p in pre.split("."))
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), parts


def _order(a: object, b: object) -> int:
    if isinstance(a, dict) and _QUANTITY in a:
        x, y = _q(a), _q(b, "operand")
        return (x > y) - (x < y)
    va, vb = _v(a), _v(b)
    ka = (va[0], va[1], va[2], va[3] is None, va[3] or ())
    kb = (vb[0], vb[1], vb[2], vb[3] is None, vb[3] or ())
    return (ka > kb) - (ka < kb)


def _quantity_of(value: Fraction) -> dict[str, str]:
    return {_QUANTITY: f"{value.numerator}/{value.denominator}"}


def _is(parse: Callable[[object], object]) -> Callable[[object], bool]:
    def check(text: object) -> bool:
        try:
            parse(text)
        except SelectorError:
            return False
        return True

    return check


def _as_integer(value: object) -> int:
    amount = _q(value)
    if amount.denominator != 1 or not -(2**63) <= amount.numerator < 2**63:
        raise SelectorError(f"quantity {amount} is not an integer that fits 64 bits")
    return amount.numerator


_FUNCTIONS: dict[str, Callable[..., object]] = {
    "quantity": quantity_value,
    "isQuantity": _is(quantity_value),
    "semver": semver_value,
    "isSemver": _is(semver_value),
    "compareTo": _order,
    "isGreaterThan": lambda a, b: _order(a, b) > 0,
    "isLessThan": lambda a, b: _order(a, b) < 0,
    "add": lambda a, b: _quantity_of(_q(a) + _q(b, "operand")),
    "sub": lambda a, b: _quantity_of(_q(a) - _q(b, "operand")),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda a: float(_q(a)),
    "isInteger": lambda a: _q(a).denominator == 1,
    "sign": lambda a: (_q(a) > 0) - (_q(a) < 0),
    "major": lambda v: _v(v)[0],
    "minor": lambda v: _v(v)[1],
    "patch": lambda v: _v(v)[2],
    # Kubernetes' CEL has the strings extension; these are the parts selectors use on attributes.
    "lowerAscii": lambda s: _str(s).lower(),
    "upperAscii": lambda s: _str(s).upper(),
    "trim": lambda s: _str(s).strip(),
    "split": lambda s, sep, *limit: _str(s).split(_str(sep), *(int(n) - 1 for n in limit)),
    "replace": lambda s, old, new, *limit: _str(s).replace(_str(old), _str(new), *(int(n) for n in limit)),
    "indexOf": lambda s, sub: _str(s).find(_str(sub)),
    "lastIndexOf": lambda s, sub: _str(s).rfind(_str(sub)),
    # Kubernetes' CEL has the sets extension (a selector such as
    # ``sets.contains(["H100", "H200"], [device.attributes[...].family])``).
    "sets.contains": lambda a, b: all(_in(x, _list(a)) for x in _list(b)),
    "sets.equivalent": lambda a, b: all(_in(x, _list(a)) for x in _list(b)) and all(_in(x, _list(b)) for x in a),
    "sets.intersects": lambda a, b: any(_in(x, _list(a)) for x in _list(b)),
}


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise SelectorError(f"a sets function was given {type(value).__name__}, not a list")
    return value


def _in(value: object, items: list[object]) -> bool:
    return any(_cel_equal(value, item) for item in items)


def _cel_equal(a: object, b: object) -> bool:
    """CEL's equality, which the sets extension uses: numbers compare across int and double, a bool is no number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_cel_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise SelectorError(f"a string function was given {type(value).__name__}")
    return value


# The domains an expression names in ``device.attributes[...]`` or ``device.capacity[...]``.
_DOMAIN_RE = re.compile(r"""device\s*\.\s*(attributes|capacity)\s*\[\s*(['"])([^'"]+)\2\s*\]""")


@functools.lru_cache(maxsize=4096)
def _domains(expression: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({(m.group(1), m.group(3)) for m in _DOMAIN_RE.finditer(expression)}))


@functools.lru_cache(maxsize=4096)
def _compiled(expression: str) -> Any:
    """The compiled program, or the syntax error's text."""
    try:
        return cel.compile(expand_bindings(expression))
    except BindError as err:
        return str(err)
    except (ValueError, RuntimeError) as err:
        return f"{err}".strip()


def check_syntax(expression: str) -> str | None:
    """None when ``expression`` compiles, else why not."""
    compiled = _compiled(expression)
    return compiled if isinstance(compiled, str) else None


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


def matches(expression: str, device: CelDevice) -> bool:
    """Whether ``expression`` selects ``device``; raises SelectorError when it cannot be evaluated."""
    verdict = device.verdicts.get(expression)
    if verdict is None:
        verdict = _evaluate(expression, device)
        device.verdicts[expression] = verdict
    if isinstance(verdict, str):
        raise SelectorError(verdict)
    return verdict


def _evaluate(expression: str, device: CelDevice) -> bool | str:
    compiled = _compiled(expression)
    if isinstance(compiled, str):
        return f"CEL expression {expression!r} does not compile: {_short(compiled)}"
    # A domain the device has nothing of reads as an empty map, as in Kubernetes (so that
    # has(device.attributes["example.com"].x) is false, not an error).
    for field_name, domain in _domains(expression):
        maps = device.value[field_name]
        if domain not in maps:
            maps[domain] = {}
            device.context = None
    if device.context is None:
        context = cel.Context()
        for name, function in _FUNCTIONS.items():
            context.add_function(name, function)
        context.add_variable("device", device.value)
        device.context = context
    try:
        result = compiled.execute(device.context)
    except (KeyError, ValueError, TypeError, RuntimeError, ZeroDivisionError, OverflowError) as err:
        text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
        if isinstance(err, KeyError):
            text = f"no such key: {text}"
        return f"CEL expression {expression!r} failed on this device: {_short(text)}"
    if not isinstance(result, bool):
        return f"CEL expression {expression!r} returned {type(result).__name__}, not a bool"
    return result
