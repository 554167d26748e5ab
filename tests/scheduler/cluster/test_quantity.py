"""Kubernetes quantities: exact values, safe rounding, and a round trip."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.cluster.quantity import (
    QuantityError,
    cpu_milli_ceil,
    cpu_milli_floor,
    format_quantity,
    mib_ceil,
    mib_floor,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("2Gi", Fraction(2 << 30)),
        ("128974848", Fraction(128974848)),
        ("129e6", Fraction(129_000_000)),
        ("1E3", Fraction(1000)),
        ("123Mi", Fraction(123 << 20)),
        ("1k", Fraction(1000)),
        ("100n", Fraction(1, 10**7)),
        ("0.5Ki", Fraction(512)),
        (".5", Fraction(1, 2)),
        ("+3", Fraction(3)),
        ("-1", Fraction(-1)),
        (4, Fraction(4)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_the_forms_the_api_server_accepts(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "abc", "1Kb", "1.2.3", "Gi", "1 Gi x", "1e999", "nan", True, None, [1], float("inf")]
)
def test_anything_else_is_refused_with_one_error_type(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_pods_round_up_and_nodes_round_down() -> None:
    assert cpu_milli_ceil("0.0001") == 1
    assert cpu_milli_floor("0.0019") == 1
    assert mib_ceil("1") == 1
    assert mib_floor("1048575") == 0
    assert mib_ceil("1Gi") == mib_floor("1Gi") == 1024
    assert cpu_milli_ceil("250m") == cpu_milli_floor("250m") == 250


_SUFFIXES = ["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti", "n", "u"]


@given(st.integers(min_value=0, max_value=10**12), st.integers(min_value=0, max_value=999), st.sampled_from(_SUFFIXES))
def test_a_parsed_quantity_formats_back_to_the_same_value(whole: int, frac: int, suffix: str) -> None:
    text = f"{whole}.{frac:03d}{suffix}"
    value = parse_quantity(text)
    if (value * 10**9).denominator == 1:
        assert parse_quantity(format_quantity(value)) == value
    else:
        with pytest.raises(QuantityError):
            format_quantity(value)


@given(st.integers(min_value=-(10**18), max_value=10**18), st.sampled_from([1, 10**3, 10**6, 10**9]))
def test_every_nano_precise_value_round_trips(numerator: int, scale: int) -> None:
    value = Fraction(numerator, scale)
    assert parse_quantity(format_quantity(value)) == value
