"""The scheduler's metric families, from a cycle result built by a real session (no API)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpuwarden.contract import EvictionAction
from gpuwarden.http import HealthServer
from gpuwarden.kube import RequestStats
from scheduler.cluster.bind import BindOutcome, BindResult
from scheduler.cluster.cycle import CycleResult
from scheduler.cluster.evict import EvictOutcome, EvictResult
from scheduler.cluster.metrics import FAMILIES, P, SchedulerMetrics, pending_pods
from scheduler.engine.model import Eviction, Snapshot
from scheduler.engine.session import run_session
from tests.scheduler.builders import job, node, pending, queue

REPO = Path(__file__).resolve().parents[3]


def _result() -> CycleResult:
    """Two queues on one 8-GPU node: team-a's 4-GPU pod fits, team-b's 16-GPU pod cannot."""
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("team-a", 4), queue("team-b", 4)),
        jobs=(
            job("a", "team-a", pending("a-0", 4)),
            job("b", "team-b", pending("b-0", 16)),
        ),
    )
    timings: dict[str, float] = {}
    decisions = run_session(snap, timings)
    assert [b.pod for b in decisions.binds] == ["a-0"]
    binds = tuple(BindResult(b, BindOutcome.BOUND, attempts=1) for b in decisions.binds)
    evicted = Eviction("ns/x", "ns", "x-0", "uid-x", "n1", EvictionAction.PREEMPT, "test")
    evictions = (EvictResult(evicted, EvictOutcome.REFUSED, error="pdb"),)
    stages = {"prepare": 0.01, "engine": 0.02, "execute": 0.01, "bookkeeping": 0.002}
    return CycleResult(snap, decisions, binds, evictions, 0.042, timings, stage_seconds=stages)


def _samples(metrics: SchedulerMetrics) -> list[Sample]:
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_cycle_counts_binds_evictions_and_phases() -> None:
    metrics = SchedulerMetrics(RequestStats(), leader=lambda: True, synced=lambda: True)
    metrics.observe(_result(), view_seconds=0.004)
    s = _samples(metrics)
    assert _value(s, f"{P}_binds_total", outcome="Bound") == 1
    assert _value(s, f"{P}_binds_total", outcome="Failed") == 0
    assert _value(s, f"{P}_evictions_total", action="Preempt", outcome="Refused") == 1
    assert _value(s, f"{P}_evictions_total", action="Reclaim", outcome="Evicted") == 0
    assert _value(s, f"{P}_cycles_total", result="ok") == 1
    assert _value(s, f"{P}_cycle_duration_seconds_count") == 1
    assert _value(s, f"{P}_cycle_duration_seconds_sum") == pytest.approx(0.042)
    for phase in ("build", "allocate", "reclaim", "preempt", "decisions"):
        assert _value(s, f"{P}_session_phase_duration_seconds_count", phase=phase) == 1
    assert _value(s, f"{P}_cycle_stage_duration_seconds_sum", stage="view") == pytest.approx(0.004)
    for stage in ("prepare", "engine", "execute", "bookkeeping"):
        assert _value(s, f"{P}_cycle_stage_duration_seconds_count", stage=stage) == 1
    assert _value(s, f"{P}_leader") == 1
    assert _value(s, f"{P}_cache_synced") == 1
    assert _value(s, f"{P}_last_cycle_timestamp_seconds") > 0


def test_queue_gauges_in_base_units() -> None:
    result = _result()
    assert pending_pods(result) == {"team-a": 0, "team-b": 1}
    metrics = SchedulerMetrics(RequestStats(), leader=lambda: True)
    metrics.observe(result)
    s = _samples(metrics)
    assert _value(s, f"{P}_pending_pods", queue="team-a") == 0
    assert _value(s, f"{P}_pending_pods", queue="team-b") == 1
    assert _value(s, f"{P}_queue_allocated", queue="team-a", resource="gpu", unit="gpu") == 4
    assert _value(s, f"{P}_queue_allocated", queue="team-a", resource="memory", unit="byte") == 1024**3
    assert _value(s, f"{P}_queue_allocated", queue="team-a", resource="cpu", unit="core") == 1
    assert _value(s, f"{P}_queue_fair_share", queue="team-a", resource="gpu", unit="gpu") >= 4


def test_standby_exports_no_queue_state() -> None:
    """A replica that does not lead would export its last (stale) view: it exports none."""
    leading = [True]
    metrics = SchedulerMetrics(RequestStats(), leader=lambda: leading[0])
    metrics.observe(_result())
    leading[0] = False
    names = {s.name for s in _samples(metrics)}
    assert f"{P}_pending_pods" not in names
    assert f"{P}_queue_fair_share" not in names
    assert _value(_samples(metrics), f"{P}_leader") == 0
    assert f"{P}_binds_total" in names  # counters stay: they count what this replica did


def test_api_errors_by_operation() -> None:
    stats = RequestStats()
    stats.record("bind_pod", ok=True)
    stats.record("bind_pod", ok=False)
    stats.record("evict_pod", ok=True)
    metrics = SchedulerMetrics(stats)
    s = _samples(metrics)
    assert _value(s, f"{P}_api_requests_total", operation="bind_pod") == 2
    assert _value(s, f"{P}_api_errors_total", operation="bind_pod") == 1
    assert _value(s, f"{P}_api_errors_total", operation="evict_pod") == 0


def test_failed_cycle_is_counted() -> None:
    metrics = SchedulerMetrics(RequestStats())
    metrics.cycle_failed()
    assert _value(_samples(metrics), f"{P}_cycles_total", result="error") == 1


def test_families_follow_prometheus_naming() -> None:
    """Counters end in _total, durations are _seconds histograms, every name has the scheduler prefix."""
    metrics = SchedulerMetrics(RequestStats(), leader=lambda: True, synced=lambda: True)
    metrics.observe(_result())
    text = generate_latest(metrics.registry).decode()
    exported = {f.name: f.type for f in text_string_to_metric_families(text)}
    for doc in FAMILIES:
        assert doc.name.startswith(f"{P}_")
        if doc.kind == "counter":
            assert doc.name.endswith("_total")
            assert exported[doc.name.removesuffix("_total")] == "counter"
        else:
            assert exported[doc.name] == doc.kind, doc.name
        if doc.kind == "histogram":
            assert doc.name.endswith("_seconds")


def test_every_metric_the_scheduler_alerts_use_is_exported_and_documented() -> None:
    import yaml

    metrics = SchedulerMetrics(RequestStats(), leader=lambda: True, synced=lambda: True)
    metrics.observe(_result())
    text = generate_latest(metrics.registry).decode()
    exported = set()
    for f in text_string_to_metric_families(text):
        exported.add(f"{f.name}_total" if f.type == "counter" else f.name)
    rules = yaml.safe_load((REPO / "manifests" / "monitoring" / "gpuwarden-rules.yaml").read_text())
    (group,) = [g for g in rules["groups"] if g["name"] == "gpuwarden.scheduler"]
    used = {m for r in group["rules"] for m in re.findall(r"\b(gpuwarden_[a-z_]+)", r["expr"])}
    assert used, "the scheduler's alerts use no metric"
    assert used <= exported
    assert used <= {d.name for d in FAMILIES}


def test_readme_documents_every_family() -> None:
    readme = (REPO / "README.md").read_text()
    documented = set(re.findall(r"`(gpuwarden_scheduler_[a-z_]+)`", readme))
    assert documented == {d.name for d in FAMILIES}


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, dict[str, tuple[bool, str]]]]:
    checks = {"live": (True, "ok"), "ready": (False, "cache not synced yet")}
    metrics = SchedulerMetrics(RequestStats(), leader=lambda: True, synced=lambda: False)
    metrics.observe(_result())
    server = HealthServer(
        metrics.registry, host="127.0.0.1", port=0, liveness=lambda: checks["live"], readiness=lambda: checks["ready"]
    )
    server.start()
    try:
        yield server, checks
    finally:
        server.stop()


def _get(server: HealthServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_http_serves_metrics_and_probes(served: tuple[HealthServer, dict[str, tuple[bool, str]]]) -> None:
    server, checks = served
    code, body = _get(server, "/metrics")
    assert code == 200
    assert f'{P}_binds_total{{outcome="Bound"}} 1.0' in body
    assert f"{P}_leader 1.0" in body
    assert _get(server, "/healthz") == (200, "ok\n")
    assert _get(server, "/readyz") == (503, "cache not synced yet\n")
    checks["ready"] = (True, "ok: cache synced")
    assert _get(server, "/readyz") == (200, "ok: cache synced\n")


def test_the_backlog_memos_attempts_are_counted_across_cycles() -> None:
    from scheduler.engine.backlog import BacklogCounts

    metrics = SchedulerMetrics(RequestStats())
    counts = BacklogCounts(placements_tried=3, placements_skipped=40, plans_tried=1, plans_skipped=2)
    metrics.observe(replace(_result(), backlog=counts))
    metrics.observe(replace(_result(), backlog=BacklogCounts(placements_skipped=43, no_plans_skipped=5)))
    metrics.observe(_result())  # the full-rebuild path has no memo
    samples = _samples(metrics)
    name = f"{P}_backlog_attempts_total"
    assert _value(samples, name, kind="placement", outcome="tried") == 3
    assert _value(samples, name, kind="placement", outcome="skipped") == 83
    assert _value(samples, name, kind="plan", outcome="tried") == 1
    assert _value(samples, name, kind="plan", outcome="skipped") == 2
    assert _value(samples, name, kind="plan", outcome="replayed") == 5
