"""Prometheus metrics of remediation (``gpuwarden_remediation_*``), and the GPU-seconds faults cost.

What describes the fleet now (nodes per state, workflows and when each
entered its state, quarantines the breaker holds, pods a drain waits for)
comes from the latest pass and is exported by the leader only, as the
scheduler's queue gauges are. Counters (transitions, Events by reason) are
kept here and survive between passes; like every counter they restart at
zero with the process, which ``rate()`` and ``increase()`` expect.

``gpuwarden_queue_gpu_seconds_lost_to_faults_total`` is the work hardware
faults took from each queue: for every pod the scheduler's health eviction
removed, its GPUs times how long it had run. It is counted by the
scheduling cycle (:mod:`scheduler.cluster.lost`), which sees those evictions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwarden.contract import METRICS_PREFIX
from gpuwarden.metricdoc import MetricFamilyDoc, family
from scheduler.remediation.controller import RemediationReport
from scheduler.remediation.model import NodeRecord
from scheduler.remediation.steps import EmitEvent

P = f"{METRICS_PREFIX}_remediation"
LOST = f"{METRICS_PREFIX}_queue_gpu_seconds_lost_to_faults_total"


def _doc(name: str, kind: str, help: str, labels: list[str]) -> MetricFamilyDoc:
    return family(P, name, kind, help, labels)


FAMILIES: tuple[MetricFamilyDoc, ...] = (
    _doc(
        "nodes",
        "gauge",
        "Nodes per remediation state (the gpuwarden.io/state label), after the latest pass.",
        ["state"],
    ),
    _doc(
        "workflow_state_since_timestamp_seconds",
        "gauge",
        "Unix time each remediation workflow (a GPU or a node) entered its current state (leader only).",
        ["node", "scope", "state"],
    ),
    _doc(
        "transitions_total",
        "counter",
        "Remediation workflows entering a state, by scope kind (gpu, node) and state.",
        ["scope", "state"],
    ),
    _doc("events_total", "counter", "Remediation Events written on Nodes, by reason.", ["reason"]),
    _doc(
        "quarantines_held",
        "gauge",
        "Nodes with a fault whose quarantine the pool's circuit breaker holds back (leader only).",
        ["pool"],
    ),
    _doc(
        "recent_faults",
        "gauge",
        "Remediation workflows started on the node within the repeat window (7 days): above 1 is a "
        "repeat offender (leader only).",
        ["node"],
    ),
    _doc(
        "drain_blocked_pods",
        "gauge",
        "Pods a drain waits for whose eviction a disruption budget refused, per node (leader only).",
        ["node"],
    ),
    MetricFamilyDoc(
        LOST,
        "counter",
        "GPU-seconds of running work that hardware faults evicted, per queue.",
        ("queue",),
    ),
)


class RemediationMetrics:
    """Remediation's families in the scheduler's registry; :meth:`observe` after each pass."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        leader: Callable[[], bool] = lambda: False,
        repeat_window_s: float = 7 * 86400.0,
    ) -> None:
        self._leader = leader
        self._window_s = repeat_window_s
        self._lock = threading.Lock()
        self._last: RemediationReport | None = None
        self._transitions: dict[tuple[str, str], int] = {}
        self._events: dict[str, int] = {}
        self._lost: dict[str, float] = {}
        registry.register(_Collector(self))

    def observe(self, report: RemediationReport) -> None:
        with self._lock:
            self._last = report
            for name, transition in report.transitions.items():
                before = {s.scope.key: s.state for s in report.before.get(name, NodeRecord()).scopes}
                for scope in transition.record.scopes:
                    if before.get(scope.scope.key) is not scope.state:
                        key = ("node" if scope.scope.is_node else "gpu", scope.state.value)
                        self._transitions[key] = self._transitions.get(key, 0) + 1
                for step in transition.steps:
                    if isinstance(step, EmitEvent):
                        self._events[step.reason.value] = self._events.get(step.reason.value, 0) + 1

    def lost(self, by_queue: Mapping[str, float]) -> None:
        """Add GPU-seconds lost to faults (from the scheduling cycle's health evictions)."""
        with self._lock:
            for queue, seconds in by_queue.items():
                self._lost[queue] = self._lost.get(queue, 0.0) + seconds

    def _collect(self) -> Iterator[Metric]:
        docs = {d.name: d for d in FAMILIES}

        def make(name: str) -> Any:
            d = docs[name]
            cls = CounterMetricFamily if d.kind == "counter" else GaugeMetricFamily
            return cls(d.name, d.help, labels=list(d.labels))

        with self._lock:
            last = self._last
            transitions = dict(self._transitions)
            events = dict(self._events)
            lost = dict(self._lost)
        counter = make(f"{P}_transitions_total")
        for (scope, state), n in sorted(transitions.items()):
            counter.add_metric([scope, state], n)
        yield counter
        counter = make(f"{P}_events_total")
        for reason, n in sorted(events.items()):
            counter.add_metric([reason], n)
        yield counter
        counter = make(LOST)
        for queue, seconds in sorted(lost.items()):
            counter.add_metric([queue], seconds)
        yield counter
        if last is None or not self._leader():
            return
        nodes = make(f"{P}_nodes")
        per_state: dict[str, int] = {}
        for transition in last.transitions.values():
            per_state[transition.label] = per_state.get(transition.label, 0) + 1
        for state, n in sorted(per_state.items()):
            nodes.add_metric([state], n)
        yield nodes
        since = make(f"{P}_workflow_state_since_timestamp_seconds")
        blocked = make(f"{P}_drain_blocked_pods")
        for name, transition in sorted(last.transitions.items()):
            count = 0
            for work in transition.record.scopes:
                since.add_metric([name, work.scope.key, work.state.value], work.since)
                count += len(work.drain_blockers)
            if count:
                blocked.add_metric([name], count)
        yield since
        yield blocked
        recent = make(f"{P}_recent_faults")
        for name, transition in sorted(last.transitions.items()):
            starts = sum(1 for h in transition.record.history if last.finished_at - h.at <= self._window_s)
            if starts:
                recent.add_metric([name], starts)
        yield recent
        held = make(f"{P}_quarantines_held")
        pools: dict[str, int] = {pool: 0 for pool in last.pools.values()}
        for name in last.breaker_held:
            pool = last.pools.get(name, "")
            pools[pool] = pools.get(pool, 0) + 1
        for pool, n in sorted(pools.items()):
            held.add_metric([pool], n)
        yield held


class _Collector(Collector):
    def __init__(self, metrics: RemediationMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics._collect()
