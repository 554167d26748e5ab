"""Flags and their environment variables: one range check, one usage error, exit status 2."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.cli import main
from gpuwarden.flags import FlagError, add_flag, env_name, port_number, seconds


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "0", "-1", "86401", "1e400", "ten", ""])
def test_a_duration_that_is_no_duration_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        seconds()(text)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_seconds_accepts_exactly_the_finite_values_in_range(value: float) -> None:
    parse = seconds(high=3600.0)
    if math.isfinite(value) and 0 < value <= 3600:
        assert parse(repr(value)) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(repr(value))


@pytest.mark.parametrize(
    ("text", "ok"),
    [("0", True), ("9402", True), ("65535", True), ("65536", False), ("-1", False), ("\u0669", False), ("80.0", False)],
)
def test_port_numbers(text: str, ok: bool) -> None:
    if ok:
        assert port_number(text) == int(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            port_number(text)


def test_a_bad_environment_value_names_the_variable_and_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_name("--poll-interval"), "nan")
    with pytest.raises(FlagError, match=r"GPUWARDEN_POLL_INTERVAL \(for --poll-interval\): must be a finite number"):
        add_flag(argparse.ArgumentParser(), "--poll-interval", type=seconds(), help="x")


@pytest.mark.parametrize(
    ("env", "value", "says"),
    [
        ("GPUWARDEN_ONCE", "maybe", "GPUWARDEN_ONCE (for --once): not a boolean"),
        ("GPUWARDEN_POLL_INTERVAL", "inf", "GPUWARDEN_POLL_INTERVAL (for --poll-interval): must be a finite"),
        ("GPUWARDEN_HEARTBEAT_PERIOD", "nan", "GPUWARDEN_HEARTBEAT_PERIOD (for --heartbeat-period): must be"),
        ("GPUWARDEN_METRICS_PORT", "http", "GPUWARDEN_METRICS_PORT (for --metrics-port): not a port number"),
        ("GPUWARDEN_BACKEND", "dcgm", "GPUWARDEN_BACKEND (for --backend): 'dcgm' is not one of nvml, sim"),
    ],
)
def test_environment_errors_are_usage_errors_like_flag_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: str, value: str, says: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SystemExit) as info:
        main(["agent", "--backend", "sim", "--once"] if env != "GPUWARDEN_BACKEND" else ["agent", "--once"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.parametrize(
    "flags",
    [
        ["--poll-interval", "nan"],
        ["--poll-interval", "inf"],
        ["--heartbeat-period", "nan"],
        ["--api-timeout", "0"],
        ["--metrics-port", "70000"],
    ],
)
def test_flag_errors_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--backend", "sim", "--once", *flags])
    assert info.value.code == 2
    assert f"argument {flags[0]}:" in capsys.readouterr().err
