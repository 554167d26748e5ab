"""The root command finds its subcommands through entry points, so the core imports neither process."""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import cli
from gpuwarden.cli import build_parser, main, registered_commands


def test_agent_scheduler_and_demo_register_through_entry_points() -> None:
    names = sorted(name for name, _ in registered_commands())
    assert names == ["agent", "demo", "scheduler"]
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"agent", "scheduler", "fairshare", "demo"} <= set(sub.choices)


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


def _entry_points(*values: str) -> Any:
    group = cli.COMMAND_GROUP
    return lambda group=group: [EntryPoint(name=v.split(".", 1)[0], value=v, group=group) for v in values]


def test_a_command_whose_package_is_not_installed_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "entry_points", _entry_points("agent.cli:register", "notinstalled.cli:register"))
    assert [name for name, _ in cli.registered_commands()] == ["agent"]


def test_a_command_that_fails_to_import_its_own_dependency_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "brokencmd").mkdir()
    (tmp_path / "brokencmd" / "__init__.py").write_text("")
    (tmp_path / "brokencmd" / "cli.py").write_text("import a_dependency_nobody_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "entry_points", _entry_points("brokencmd.cli:register"))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_nobody_installed"):
        cli.registered_commands()
