"""Kubernetes resource quantities ("500m", "2Gi", "1.5", "1e3") as exact numbers.

The API server hands quantities back as strings in any of the forms it
accepts, and the engine wants integers in its own units (millicores, MiB).
Parsing to a :class:`fractions.Fraction` keeps the value exact, so that
rounding happens once, in the direction the caller chooses: up for what a
pod asks (never under-count demand), down for what a node offers (never
promise capacity it does not have).

The same few strings recur across hundreds of thousands of pods, so the
unit conversions are cached by string.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# sign, digits with an optional fraction, then a binary suffix, a decimal
# suffix or a decimal exponent (the grammar of k8s.io/apimachinery's Quantity).
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?:[eE](?P<exp>[+-]?[0-9]+))|(?P<dec>[numkMGTPE]?))$"
)
# Exponents beyond this are refused rather than turned into numbers with
# millions of digits by a malformed object.
_MAX_EXPONENT = 30

MIB = 1 << 20


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse_quantity(text: object) -> Fraction:
    """The exact value of a quantity; ints and floats are accepted as numbers.

    Raises :class:`QuantityError` for anything else (including NaN, infinities
    and absurd exponents), so the caller decides what a bad field means.
    """
    if isinstance(text, bool):
        raise QuantityError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"not a quantity: {text!r}")
        return Fraction(text)
    if not isinstance(text, str):
        raise QuantityError(f"not a quantity: {text!r}")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {text!r}")
    number = Fraction(match["num"])
    if match["bin"]:
        return number * _BINARY[match["bin"]]
    if match["exp"] is not None:
        exp = int(match["exp"])
        if abs(exp) > _MAX_EXPONENT:
            raise QuantityError(f"quantity exponent out of range: {text!r}")
        return number * Fraction(10) ** exp
    return number * _DECIMAL[match["dec"] or ""]


def format_quantity(value: Fraction | int) -> str:
    """A quantity string that :func:`parse_quantity` reads back as ``value`` exactly.

    Quantities are decimal with at most nano precision; a value finer than
    that (1/3) has no quantity form and raises :class:`QuantityError`.
    """
    value = Fraction(value)
    for scale, suffix in ((1, ""), (10**3, "m"), (10**6, "u"), (10**9, "n")):
        scaled = value * scale
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    raise QuantityError(f"{value} is finer than a nano-unit")


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


@lru_cache(maxsize=4096, typed=True)
def cpu_milli_ceil(text: str | int | float) -> int:
    """Millicores, rounded up (what a pod asks)."""
    return _ceil(parse_quantity(text) * 1000)


@lru_cache(maxsize=4096, typed=True)
def cpu_milli_floor(text: str | int | float) -> int:
    """Millicores, rounded down (what a node offers)."""
    return math.floor(parse_quantity(text) * 1000)


@lru_cache(maxsize=4096, typed=True)
def mib_ceil(text: str | int | float) -> int:
    """Bytes as MiB, rounded up (what a pod asks)."""
    return _ceil(parse_quantity(text) / MIB)


@lru_cache(maxsize=4096, typed=True)
def mib_floor(text: str | int | float) -> int:
    """Bytes as MiB, rounded down (what a node offers)."""
    return math.floor(parse_quantity(text) / MIB)


@lru_cache(maxsize=4096, typed=True)
def count_ceil(text: str | int | float) -> int:
    """A count (GPUs, MiB of an extended resource), rounded up."""
    return _ceil(parse_quantity(text))


@lru_cache(maxsize=4096, typed=True)
def count_floor(text: str | int | float) -> int:
    """A count, rounded down."""
    return math.floor(parse_quantity(text))
