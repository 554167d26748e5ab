"""The shipped alert rules: valid, unit-tested by promtool, and in sync.

promtool is installed by the test setup (``make tools``); a missing promtool
fails these tests rather than skipping them, so alerts never ship untested.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).resolve().parents[3] / "manifests" / "monitoring"
RULES = MONITORING / "gpuwarden-rules.yaml"
RULES_TEST = MONITORING / "gpuwarden-rules.test.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path is not None, "promtool is missing: run `make tools` (installs Debian's prometheus package)"
    return path


def _load(path: Path) -> Any:
    with path.open() as fh:
        return yaml.safe_load(fh)


def test_promtool_checks_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", RULES_TEST.name],
        cwd=MONITORING,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    alerts = {r["alert"] for g in _load(RULES)["groups"] for r in g["rules"] if "alert" in r}
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in _load(RULES_TEST)["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts, "no alerts found"
    assert alerts - fired == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested not firing"


def test_prometheusrule_carries_exactly_the_rules_file() -> None:
    rule = _load(PROMETHEUS_RULE)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"] == _load(RULES)


def test_required_alerts_are_present() -> None:
    alerts = {r["alert"] for g in _load(RULES)["groups"] for r in g["rules"] if "alert" in r}
    assert {
        "GpuwardenFatalXid",
        "GpuwardenRowRemapFailure",
        "GpuwardenNvlinkDown",
        "GpuwardenPcieDegraded",
        "GpuwardenInfinibandPortDegraded",
        "GpuwardenAgentAbsent",
        "GpuwardenNodeQuarantinedTooLong",
    } <= alerts
