"""Remediation's metric families: exported from a real pass's report, documented, and what the alerts use."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.contract import Action
from scheduler.remediation.controller import RemediationReport
from scheduler.remediation.machine import advance
from scheduler.remediation.metrics import FAMILIES, LOST, P, RemediationMetrics
from scheduler.remediation.model import NodeRecord
from scheduler.remediation.observations import GpuIdentity, Observations
from scheduler.remediation.policy import Settings
from tests.scheduler.remediation.builders import xid

REPO = Path(__file__).resolve().parents[3]
NOW = 1_764_600_000.0


def _exported(metrics_registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(metrics_registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        out[name] = [(s.labels, s.value) for s in fam.samples if not s.name.endswith("_created")]
    return out


def _report() -> RemediationReport:
    """One real pass of the machine: a GPU fault quarantines GPU 3 of n1."""
    obs = Observations(node="n1", pool="train", gpus=(GpuIdentity(3, "GPU-3"),), faults=(xid(48, 3, Action.RESET_GPU),))
    transition = advance(NodeRecord(), obs, NOW, Settings())
    return RemediationReport(
        transitions={"n1": transition}, before={"n1": NodeRecord()}, pools={"n1": "train"}, finished_at=NOW
    )


def test_a_pass_is_counted_and_the_leader_exports_the_fleet() -> None:
    registry = CollectorRegistry()
    metrics = RemediationMetrics(registry, leader=lambda: True)
    metrics.observe(_report())
    metrics.lost({"team-a": 3600.0})
    got = _exported(registry)
    # Quarantined, and with a drain slot free, draining in the same pass.
    assert got[f"{P}_nodes"] == [({"state": "gpu-draining"}, 1.0)]
    assert ({"scope": "gpu", "state": "draining"}, 1.0) in got[f"{P}_transitions_total"]
    assert any(labels["reason"] == "GpuQuarantined" for labels, _ in got[f"{P}_events_total"])
    (since,) = got[f"{P}_workflow_state_since_timestamp_seconds"]
    assert since == ({"node": "n1", "scope": "gpu-3", "state": "draining"}, NOW)
    assert got[LOST] == [({"queue": "team-a"}, 3600.0)]
    assert got[f"{P}_quarantines_held"] == [({"pool": "train"}, 0.0)]


def test_a_standby_exports_counters_only() -> None:
    registry = CollectorRegistry()
    metrics = RemediationMetrics(registry, leader=lambda: False)
    metrics.observe(_report())
    got = _exported(registry)
    assert f"{P}_nodes" not in got and f"{P}_transitions_total" in got


def test_every_family_is_documented_and_every_alert_metric_exported() -> None:
    registry = CollectorRegistry()
    metrics = RemediationMetrics(registry, leader=lambda: True)
    metrics.observe(_report())
    exported = set(_exported(registry))
    readme = (REPO / "README.md").read_text()
    documented = set(re.findall(r"`(gpuwarden_(?:remediation|queue)_[a-z_]+)`", readme))
    assert documented == {d.name for d in FAMILIES}
    rules = yaml.safe_load((REPO / "manifests" / "monitoring" / "gpuwarden-rules.yaml").read_text())
    used = {
        m
        for g in rules["groups"]
        for r in g["rules"]
        for m in re.findall(r"\b(gpuwarden_remediation_[a-z_]+)", r["expr"])
    }
    assert used and used <= {d.name for d in FAMILIES}
    assert used - {f"{P}_recent_faults", f"{P}_drain_blocked_pods"} <= exported
