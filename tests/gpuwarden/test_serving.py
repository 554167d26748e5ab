"""The /metrics security flags: plain HTTP by default, and combinations that cannot work refused as usage errors."""

from __future__ import annotations

import pytest

from gpuwarden.cli import build_parser, main
from gpuwarden.metricsauth import bearer_token
from gpuwarden.serving import MetricsSecurity, security_from_args


def _security(*argv: str, command: str = "agent") -> MetricsSecurity:
    return security_from_args(build_parser().parse_args([command, *argv]))


@pytest.mark.parametrize("command", ["agent", "scheduler"])
def test_plain_http_without_authentication_is_the_default(command: str) -> None:
    assert _security(command=command) == MetricsSecurity(tls=False, cert_file=None, key_file=None, auth="none")


@pytest.mark.parametrize("command", ["agent", "scheduler"])
def test_tls_with_files_and_delegated_authorization(command: str) -> None:
    argv = ["--metrics-tls", "--metrics-tls-cert-file=/c", "--metrics-tls-key-file=/k", "--metrics-auth=delegated"]
    assert _security(*argv, command=command) == MetricsSecurity(
        tls=True, cert_file="/c", key_file="/k", auth="delegated"
    )
    # TLS alone (self-signed, no authorization) is a mode of its own.
    assert _security("--metrics-tls", command=command) == MetricsSecurity(tls=True)


def test_the_environment_sets_the_same_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_METRICS_TLS", "true")
    monkeypatch.setenv("GPUWARDEN_METRICS_AUTH", "delegated")
    monkeypatch.setenv("GPUWARDEN_METRICS_TLS_CERT_FILE", "/etc/tls/tls.crt")
    monkeypatch.setenv("GPUWARDEN_METRICS_TLS_KEY_FILE", "/etc/tls/tls.key")
    assert _security() == MetricsSecurity(
        tls=True, cert_file="/etc/tls/tls.crt", key_file="/etc/tls/tls.key", auth="delegated"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--metrics-auth=delegated"], "--metrics-auth=delegated needs --metrics-tls"),
        (["--metrics-tls", "--metrics-tls-cert-file=/c"], "--metrics-tls-cert-file needs --metrics-tls-key-file"),
        (["--metrics-tls", "--metrics-tls-key-file=/k"], "--metrics-tls-key-file needs --metrics-tls-cert-file"),
        (["--metrics-tls-cert-file=/c", "--metrics-tls-key-file=/k"], "need --metrics-tls"),
    ],
)
def test_combinations_that_cannot_work_exit_2_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # --once with the sim backend would print a report: the refusal comes first.
    for command in (["agent", "--backend=sim", "--once"], ["scheduler"]):
        with pytest.raises(SystemExit) as exit_:
            main([*command, *argv])
        assert exit_.value.code == 2
        err = capsys.readouterr()
        assert message in err.err
        assert "gpuwarden agent report" not in err.out


def test_a_bad_mode_in_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUWARDEN_METRICS_AUTH", "basic")
    with pytest.raises(SystemExit) as exit_:
        main(["agent", "--once"])
    assert exit_.value.code == 2
    assert (
        "GPUWARDEN_METRICS_AUTH (for --metrics-auth): 'basic' is not one of none, delegated" in capsys.readouterr().err
    )


def test_delegated_mode_without_tls_from_the_environment_is_refused_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUWARDEN_METRICS_AUTH", "delegated")
    with pytest.raises(SystemExit) as exit_:
        main(["agent", "--backend=sim", "--once"])
    assert exit_.value.code == 2
    assert "needs --metrics-tls" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer abc.def", "abc.def"),
        ("bearer abc", "abc"),
        ("  Bearer  abc  ", "abc"),
    ],
)
def test_bearer_tokens_are_read_from_the_authorization_header(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token
