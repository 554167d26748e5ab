"""Kubernetes quantities read exactly, and engine units written back."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.cluster.quantity import (
    QuantityError,
    count_ceil,
    count_floor,
    cpu_milli_ceil,
    cpu_milli_floor,
    format_cpu,
    format_gpus,
    format_memory,
    mebibytes,
    mib_ceil,
    mib_floor,
    milli_gpus,
    millicores,
    parse_quantity,
)

SUFFIXES = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(1000),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(1024),
    "Mi": Fraction(1024**2),
    "Gi": Fraction(1024**3),
    "Ti": Fraction(1024**4),
    "Pi": Fraction(1024**5),
    "Ei": Fraction(1024**6),
}


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("500m", Fraction(1, 2)),
        ("16", Fraction(16)),
        ("64Gi", Fraction(64 * 1024**3)),
        ("1.5Ti", Fraction(3 * 1024**4, 2)),
        ("1e3", Fraction(1000)),
        ("2E-3", Fraction(2, 1000)),
        ("1E", Fraction(10**18)),
        (".5", Fraction(1, 2)),
        ("+4", Fraction(4)),
        ("0.1", Fraction(1, 10)),
        (8, Fraction(8)),
        (0.3, Fraction(3, 10)),
        (1e20, Fraction(10**20)),
    ],
)
def test_quantities_read_exactly(text: object, amount: Fraction) -> None:
    assert parse_quantity(text) == amount


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "must not be negative"),
        ("-1", "must not be negative"),
        ("-500m", "must not be negative"),
        (-0.5, "must not be negative"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        ("nan", "not a quantity"),
        ("Infinity", "not a quantity"),
        ("1.5.2", "not a quantity"),
        ("64GB", "not a quantity"),
        ("", "not a quantity"),
        ("1e999999999", "exponent out of range"),
        (True, "expected a quantity"),
        (None, "expected a quantity"),
        ([1], "expected a quantity"),
    ],
)
def test_what_is_not_an_amount_is_named(value: object, message: str) -> None:
    problem = parse_quantity(value)
    assert isinstance(problem, str)
    assert message in problem


def test_engine_units_round_up() -> None:
    assert millicores("500m") == 500
    assert millicores("1.5") == 1500
    assert millicores("1n") == 1  # never less than written
    assert millicores(16) == 16000
    assert mebibytes("64Gi") == 65536
    assert mebibytes("1.5Ti") == 1536 * 1024
    assert mebibytes("1G") == 954  # 10^9 bytes is 953.67 MiB
    assert mebibytes(1) == 1
    assert milli_gpus(0.5) == 500
    assert milli_gpus(0.3) == 300  # not 301: no float on the way
    assert milli_gpus("0.0001") == 1


def test_amounts_beyond_any_cluster_are_refused() -> None:
    for value, parse in ((2_000_000, milli_gpus), ("1e9", millicores), ("2Ei", mebibytes)):
        problem = parse(value)
        assert isinstance(problem, str)
        assert "beyond any cluster" in problem


@given(st.integers(0, 10**12), st.sampled_from(sorted(SUFFIXES)))
def test_integer_with_any_suffix_round_trips(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * SUFFIXES[suffix]


@given(st.integers(0, 10**9), st.integers(0, 9), st.sampled_from(sorted(SUFFIXES)))
def test_decimal_with_any_suffix_round_trips(whole: int, tenths: int, suffix: str) -> None:
    assert parse_quantity(f"{whole}.{tenths}{suffix}") == (whole + Fraction(tenths, 10)) * SUFFIXES[suffix]


@given(st.integers(0, 10**6), st.integers(-12, 12))
def test_exponents_round_trip(mantissa: int, exponent: int) -> None:
    assert parse_quantity(f"{mantissa}e{exponent}") == mantissa * Fraction(10) ** exponent


@given(st.integers(0, 100_000_000 * 1000))
def test_cpu_written_back_reads_the_same(milli: int) -> None:
    assert millicores(format_cpu(milli)) == milli


@given(st.integers(0, 2**40))
def test_memory_written_back_reads_the_same(mib: int) -> None:
    assert mebibytes(format_memory(mib)) == mib


@given(st.integers(0, 1_000_000 * 1000))
def test_gpus_written_back_read_the_same(milli: int) -> None:
    assert milli_gpus(format_gpus(milli)) == milli


@given(st.floats(allow_nan=False, allow_infinity=False, max_value=-1e-300))
def test_no_negative_number_is_an_amount(value: float) -> None:
    assert isinstance(parse_quantity(value), str)
    assert isinstance(parse_quantity(repr(value)), str)


@pytest.mark.parametrize(
    ("fn", "text", "value"),
    [
        (cpu_milli_ceil, "1500m", 1500),
        (cpu_milli_ceil, "0.0001", 1),  # a pod asking a sliver asks a millicore
        (cpu_milli_floor, "0.0001", 0),  # a node offering a sliver offers none
        (mib_ceil, "1Gi", 1024),
        (mib_ceil, 1, 1),
        (mib_floor, "1500Ki", 1),
        (count_ceil, "2", 2),
        (count_floor, 7, 7),
    ],
)
def test_pod_amounts_round_up_and_node_amounts_down(fn: Callable[[object], int], text: object, value: int) -> None:
    assert fn(text) == value


@pytest.mark.parametrize("text", ["", "nan", "-1", "1.5.5", "12Q", True])
def test_the_cached_converters_raise_on_what_is_no_amount(text: object) -> None:
    with pytest.raises(QuantityError):
        cpu_milli_ceil(text)  # type: ignore[arg-type]
