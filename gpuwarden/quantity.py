"""The Kubernetes quantity grammar ("500m", "64Gi", "1.5Ti", "1e3", "1k"), read exactly.

Shared by the agent and the scheduler: the API server rewrites a quantity in
its canonical form (a node's ``gpuwarden.io/gpu-memory: "1000"`` reads back
as ``"1k"``), so anything that reads a quantity back must read the grammar,
not ``int()``. The amount is a :class:`~fractions.Fraction`, never a float,
so ``0.1`` is exactly a tenth; the caller decides how to round it into its
own units.

Only amounts (nothing negative, nothing not finite) are accepted; a problem
comes back as a sentence, never as an exception, so that one bad object
marks that object rather than stopping a watch. :func:`exact` raises instead,
for readers that log and fall back.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Final

SUFFIX: Final[dict[str, Fraction]] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
# The CRDs' pattern for quantity strings says the same (manifests/scheduler/crds/).
_QUANTITY: Final = re.compile(
    r"\+?(?P<number>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:(?P<suffix>[KMGTPE]i|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?"
)
# No amount a cluster holds needs an exponent beyond this; refusing larger
# ones keeps "1e999999999" from building a number with a billion digits.
_MAX_EXPONENT: Final = 30
# Nor a number written with more digits than this (Decimal would take them all).
_MAX_DIGITS: Final = 64


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity (or not an amount)."""


def parse_quantity(value: object) -> Fraction | str:
    """The exact amount a quantity (string) or JSON number stands for, or why it is none."""
    if isinstance(value, bool):
        return f"expected a quantity, got {value!r}"
    if isinstance(value, int):
        return Fraction(value) if value >= 0 else f"must not be negative, got {value}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if value < 0:
            return f"must not be negative, got {value!r}"
        # The shortest decimal that reads back as this float: what was written.
        return Fraction(Decimal(repr(value)))
    if not isinstance(value, str):
        return f"expected a quantity, got {_shown(value)}"
    text = value.strip()
    match = _QUANTITY.fullmatch(text) if len(text) <= _MAX_DIGITS else None
    if match is None:
        if text.startswith("-"):
            return f"must not be negative, got {_shown(value)}"
        return f"not a quantity: {_shown(value)} (write e.g. 8, 500m, 1.5, 64Gi)"
    number = Fraction(Decimal(match["number"]))
    exp = match["exp"]
    if exp is not None:
        power = int(exp)
        if abs(power) > _MAX_EXPONENT:
            return f"exponent out of range in {value!r}"
        return number * Fraction(10) ** power
    return number * SUFFIX[match["suffix"] or ""]


def exact(value: object) -> Fraction:
    """:func:`parse_quantity`, raising :class:`QuantityError` with the reason."""
    amount = parse_quantity(value)
    if isinstance(amount, str):
        raise QuantityError(amount)
    return amount


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"
