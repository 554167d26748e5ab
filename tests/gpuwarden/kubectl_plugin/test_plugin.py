"""The plugin's offline side: ``simulate`` is the engine's own offline mode, and the command is installable."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml

from gpuwarden import cli
from gpuwarden.kubectl_plugin import cli as plugin

REPO = Path(__file__).resolve().parents[3]
SNAPSHOT = REPO / "scheduler" / "examples" / "snapshot.yaml"


def _run(main: object, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)  # type: ignore[operator]
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("output", "decisions_format"), [("table", "text"), ("json", "json"), ("yaml", "yaml")])
def test_simulate_prints_what_the_scheduler_prints_for_the_snapshot(
    output: str, decisions_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, shown, _ = _run(plugin.main, ["simulate", str(SNAPSHOT), "-o", output], capsys)
    assert code == 0
    _, expected, _ = _run(
        cli.main,
        ["--log-level", "warning", "scheduler", "--snapshot", str(SNAPSHOT), "--decisions-format", decisions_format],
        capsys,
    )
    assert shown == expected
    if output == "table":
        assert shown.startswith("Binds (") and "\nPending (" in shown
    elif output == "json":
        assert json.loads(shown)["binds"]
    else:
        _, as_json, _ = _run(plugin.main, ["simulate", str(SNAPSHOT), "-o", "json"], capsys)
        assert yaml.safe_load(shown) == json.loads(as_json)


def test_simulate_a_missing_file_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert _run(plugin.main, ["simulate", str(missing)], capsys) == (
        1,
        "",
        f"error: no such snapshot file: {missing}\n",
    )


def test_an_unreadable_kubeconfig_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    code, out, err = _run(plugin.main, ["queues", "--kubeconfig", str(broken)], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot use the kubeconfig {broken}: ") and err.count("\n") == 1


def test_the_console_script_is_named_for_kubectl_and_runs_the_plugin() -> None:
    """kubectl runs ``kubectl-gpuwarden`` for ``kubectl gpuwarden``; the name is the whole contract."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["kubectl-gpuwarden"].partition(":")
    assert (module, function) == ("gpuwarden.kubectl_plugin.cli", "main")
    assert getattr(plugin, function) is plugin.main
