"""The shared quantity grammar: what the API server writes back reads as what was sent."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpuwarden.quantity import QuantityError, exact, parse_quantity


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("1k", Fraction(1000)),
        ("652472", Fraction(652472)),
        ("1M", Fraction(10**6)),
        ("64Gi", Fraction(64 * 2**30)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("1e3", Fraction(1000)),
        (".5", Fraction(1, 2)),
        (8, Fraction(8)),
    ],
)
def test_quantities_read_exactly(text: object, amount: Fraction) -> None:
    assert parse_quantity(text) == amount == exact(text)


@pytest.mark.parametrize("text", ["lots", "-1", "1e999", "1 k", "", True, None, "9" * 10_000])
def test_what_is_no_amount_is_a_short_reason(text: object) -> None:
    reason = parse_quantity(text)
    assert isinstance(reason, str) and len(reason) < 200
    with pytest.raises(QuantityError):
        exact(text)
