"""The root command finds its subcommands through entry points, so the core imports neither process."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from gpuwarden.cli import build_parser, main, registered_commands


def test_agent_and_scheduler_register_through_entry_points() -> None:
    names = [name for name, _ in registered_commands()]
    assert names == ["agent", "scheduler"]
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"agent", "scheduler", "fairshare"} <= set(sub.choices)


def test_a_registered_command_runs_with_the_root_flags(capsys: pytest.CaptureFixture[str]) -> None:
    def register(sub: Any) -> None:
        parser = sub.add_parser("hello")
        parser.set_defaults(func=lambda args: print(f"hello at {args.log_level}") or 0)

    args = build_parser([("hello", register)]).parse_args(["--log-level", "debug", "hello"])
    assert args.func(args) == 0
    assert capsys.readouterr().out == "hello at debug\n"


def test_an_unknown_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--log-level", "loud", "fairshare", "never-read.yaml"])
    assert info.value.code == 2
    assert "unknown log level 'loud'" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("gpuwarden 0.")
