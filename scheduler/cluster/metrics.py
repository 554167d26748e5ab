"""Prometheus metrics of the connected scheduler (``gpuwarden_scheduler_*``).

Durations are histograms fed as each cycle ends, so a scrape every 30 s
still sees every cycle; counters (binds, evictions, cycles) are kept here
and rendered at scrape time, pre-filled with every outcome so ``rate()``
works from the first scrape. What describes the cluster now (pending pods,
fair share and allocation per queue) is rendered from the latest cycle at
scrape time and only by the leader: a standby's last result goes stale the
moment it stops leading, and a queue that is deleted stops being exported
instead of keeping its last value. API requests and errors come from the
client's own counts (:class:`gpuwarden.kube.RequestStats`).

Quantities are exported in base units, as Prometheus asks: GPUs, CPU cores
and bytes, with the unit in a ``unit`` label (as kube-state-metrics does)
because one family carries all three resources.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwarden.contract import METRICS_PREFIX, EvictionAction
from gpuwarden.kube import RequestStats
from gpuwarden.metricdoc import MetricFamilyDoc, family
from scheduler.cluster.bind import BindOutcome
from scheduler.cluster.convert import is_external_queue
from scheduler.cluster.cycle import CycleResult
from scheduler.cluster.evict import EvictOutcome
from scheduler.engine.backlog import BacklogCounts
from scheduler.engine.model import Resources, TaskStatus

P = f"{METRICS_PREFIX}_scheduler"

# A cycle is milliseconds on a small cluster and seconds at 150,000 pods.
CYCLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

QUEUE_LABELS = ["queue", "pool", "resource", "unit"]

MIB = 1024 * 1024


def _doc(name: str, kind: str, help: str, labels: list[str]) -> MetricFamilyDoc:
    return family(P, name, kind, help, labels)


FAMILIES: tuple[MetricFamilyDoc, ...] = (
    _doc("cycle_duration_seconds", "histogram", "Seconds one scheduling cycle took, end to end.", []),
    _doc(
        "session_phase_duration_seconds",
        "histogram",
        "Seconds the scheduling session spent per phase "
        "(build or update of the working state, each action, decisions, undo).",
        ["phase"],
    ),
    _doc(
        "cycle_stage_duration_seconds",
        "histogram",
        "Seconds one scheduling cycle spent per stage: view (the watch cache's copy), prepare (grouping "
        "and the Snapshot), engine (the session), execute (evictions, the binds behind evictions, which the cycle "
        "waits for, and writing the first request of those onto free room, whose answers it does not wait for), "
        "bookkeeping "
        "(PodGroups, reservations, status).",
        ["stage"],
    ),
    _doc("cycles_total", "counter", "Scheduling cycles run by this replica, by result (ok, error).", ["result"]),
    _doc(
        "backlog_attempts_total",
        "counter",
        "Attempts the sessions made and those their backlog memo spared, since start: kind placement (a "
        "gang's placement) or plan (a victim plan), outcome tried, skipped (known to fail) or replayed (a "
        "job known to get no plan, its notes given again).",
        ["kind", "outcome"],
    ),
    _doc("last_cycle_timestamp_seconds", "gauge", "Unix time the latest cycle of this replica finished.", []),
    _doc("binds_total", "counter", "Pod binds by outcome (Bound, Deferred, Conflict, Failed).", ["outcome"]),
    _doc(
        "evictions_total",
        "counter",
        "Pod evictions by the action that decided them and by outcome (Evicted, Gone, Refused, Failed).",
        ["action", "outcome"],
    ),
    _doc(
        "pods_on_quarantined_gpu_total",
        "counter",
        "Whole-GPU pods the kubelet's device manager started on a GPU out of service that gpuwarden had not "
        "assigned them (the device plugin still offered it), by the outcome of their eviction.",
        ["outcome"],
    ),
    _doc("pending_pods", "gauge", "Pods of the queue still pending after the latest cycle (leader only).", ["queue"]),
    _doc(
        "reservations",
        "gauge",
        "Reservations (room on one node held for one pod group until it binds) after the latest cycle (leader only).",
        [],
    ),
    _doc(
        "queue_fair_share",
        "gauge",
        "Fair share of the queue per node pool and resource after the latest cycle (leader only).",
        QUEUE_LABELS,
    ),
    _doc(
        "queue_allocated",
        "gauge",
        "What the queue holds per node pool and resource after the latest cycle (leader only).",
        QUEUE_LABELS,
    ),
    _doc("api_requests_total", "counter", "Kubernetes API requests by operation since start.", ["operation"]),
    _doc(
        "api_errors_total", "counter", "Kubernetes API requests that failed, by operation, since start.", ["operation"]
    ),
    _doc("leader", "gauge", "1 if this replica holds the leader lease and schedules.", []),
    _doc("cache_synced", "gauge", "1 once the watch cache has listed every resource it watches.", []),
)


def _base_units(r: Resources) -> tuple[tuple[str, str, float], ...]:
    """Engine units (milli-GPU, millicores, MiB) as (resource, unit, value) in base units."""
    return (("gpu", "gpu", r.gpu / 1000), ("cpu", "core", r.cpu / 1000), ("memory", "byte", float(r.memory * MIB)))


def pending_pods(result: CycleResult) -> dict[str, int]:
    """Pods still pending per queue once the cycle's successful binds, and those it sent, are counted out."""
    bound = {b.bind.uid for b in result.binds if b.ok} | {b.uid for b in result.sent}
    out: dict[str, int] = {}
    for job in result.snapshot.jobs:
        if is_external_queue(job.queue):
            continue
        waiting = sum(1 for t in job.tasks if t.status is TaskStatus.PENDING and t.uid not in bound)
        out[job.queue] = out.get(job.queue, 0) + waiting
    for queue in result.snapshot.queues:
        if not is_external_queue(queue.name):
            out.setdefault(queue.name, 0)
    return out


_BACKLOG_KEYS = (
    ("placement", "tried"),
    ("placement", "skipped"),
    ("plan", "tried"),
    ("plan", "skipped"),
    ("plan", "replayed"),
)


def _backlog_counts(c: BacklogCounts) -> dict[tuple[str, str], int]:
    return {
        ("placement", "tried"): c.placements_tried,
        ("placement", "skipped"): c.placements_skipped,
        ("plan", "tried"): c.plans_tried,
        ("plan", "skipped"): c.plans_skipped,
        ("plan", "replayed"): c.no_plans_skipped,
    }


class SchedulerMetrics:
    """The scheduler's registry; :meth:`observe` after each cycle, the rest is read at scrape time."""

    def __init__(
        self,
        stats: RequestStats,
        *,
        leader: Callable[[], bool] = lambda: False,
        synced: Callable[[], bool] = lambda: False,
    ) -> None:
        self.registry = CollectorRegistry()
        self._stats = stats
        self._leader = leader
        self._synced = synced
        self._lock = threading.Lock()
        self._cycle = Histogram(
            f"{P}_cycle_duration_seconds", FAMILIES[0].help, buckets=CYCLE_BUCKETS, registry=self.registry
        )
        self._phase = Histogram(
            f"{P}_session_phase_duration_seconds",
            FAMILIES[1].help,
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        self._stage = Histogram(
            f"{P}_cycle_stage_duration_seconds",
            FAMILIES[2].help,
            ["stage"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        # Each label's histogram, looked up once: ``labels()`` takes a lock
        # and builds a key, fifteen times a cycle at a cycle per arriving pod.
        self._phases: dict[str, Histogram] = {}
        self._stages: dict[str, Histogram] = {}
        self._cycles = {"ok": 0, "error": 0}
        self._binds = {o.value: 0 for o in BindOutcome}
        self._evictions = {(a.value, o.value): 0 for a in EvictionAction for o in EvictOutcome}
        self._misplaced = {o.value: 0 for o in EvictOutcome}
        self._backlog = dict.fromkeys(_BACKLOG_KEYS, 0)
        self._last: CycleResult | None = None
        self._last_finished: float | None = None
        self.registry.register(_Collector(self))

    def observe(self, result: CycleResult, *, view_seconds: float | None = None) -> None:
        """Count one finished cycle (``view_seconds``: how long the runner took to make its view)."""
        self._cycle.observe(result.seconds)
        for phase, seconds in result.session_seconds.items():
            _child(self._phase, self._phases, phase).observe(seconds)
        if view_seconds is not None:
            _child(self._stage, self._stages, "view").observe(view_seconds)
        for stage, seconds in result.stage_seconds.items():
            _child(self._stage, self._stages, stage).observe(seconds)
        with self._lock:
            self._cycles["ok"] += 1
            for b in result.binds:
                self._binds[b.outcome.value] = self._binds.get(b.outcome.value, 0) + 1
            for e in result.evictions:
                key = (e.eviction.action.value, e.outcome.value)
                self._evictions[key] = self._evictions.get(key, 0) + 1
            for m in result.misplaced:
                self._misplaced[m.outcome.value] = self._misplaced.get(m.outcome.value, 0) + 1
            if result.backlog is not None:
                for key, n in _backlog_counts(result.backlog).items():
                    self._backlog[key] += n
            self._last = result
            self._last_finished = time.time()

    def cycle_failed(self) -> None:
        """Count a cycle that raised (its partial effects are not known)."""
        with self._lock:
            self._cycles["error"] += 1
            self._last_finished = time.time()

    def _collect(self) -> Iterator[Metric]:
        docs = {d.name: d for d in FAMILIES}

        def gauge(name: str) -> GaugeMetricFamily:
            d = docs[f"{P}_{name}"]
            return GaugeMetricFamily(d.name, d.help, labels=list(d.labels))

        def counter(name: str) -> CounterMetricFamily:
            d = docs[f"{P}_{name}"]
            return CounterMetricFamily(d.name, d.help, labels=list(d.labels))

        with self._lock:
            cycles = dict(self._cycles)
            binds = dict(self._binds)
            evictions = dict(self._evictions)
            misplaced = dict(self._misplaced)
            backlog = dict(self._backlog)
            last = self._last
            finished = self._last_finished
        leading = self._leader()

        family: CounterMetricFamily | GaugeMetricFamily = counter("cycles_total")
        for result, n in sorted(cycles.items()):
            family.add_metric([result], n)
        yield family
        if finished is not None:
            family = gauge("last_cycle_timestamp_seconds")
            family.add_metric([], finished)
            yield family
        family = counter("binds_total")
        for outcome, n in sorted(binds.items()):
            family.add_metric([outcome], n)
        yield family
        family = counter("evictions_total")
        for (action, outcome), n in sorted(evictions.items()):
            family.add_metric([action, outcome], n)
        yield family
        family = counter("pods_on_quarantined_gpu_total")
        for outcome, n in sorted(misplaced.items()):
            family.add_metric([outcome], n)
        yield family
        family = counter("backlog_attempts_total")
        for (kind, outcome), n in sorted(backlog.items()):
            family.add_metric([kind, outcome], n)
        yield family

        if leading and last is not None:
            family = gauge("pending_pods")
            for queue, n in sorted(pending_pods(last).items()):
                family.add_metric([queue], n)
            yield family
            family = gauge("reservations")
            family.add_metric([], len(last.reservations))
            yield family
            shares = [s for s in last.decisions.queue_shares if not is_external_queue(s.queue)]
            for name, attr in (("queue_fair_share", "fair_share"), ("queue_allocated", "allocated")):
                family = gauge(name)
                for s in shares:
                    for resource, unit, value in _base_units(getattr(s, attr)):
                        if value >= 0:  # an unlimited share has no number to export
                            family.add_metric([s.queue, s.pool, resource, unit], value)
                yield family

        requests, errors = self._stats.snapshot()
        family = counter("api_requests_total")
        for op, n in sorted(requests.items()):
            family.add_metric([op], n)
        yield family
        family = counter("api_errors_total")
        for op in sorted(requests):
            family.add_metric([op], errors.get(op, 0))
        yield family

        family = gauge("leader")
        family.add_metric([], 1.0 if leading else 0.0)
        yield family
        family = gauge("cache_synced")
        family.add_metric([], 1.0 if self._synced() else 0.0)
        yield family


class _Collector(Collector):
    def __init__(self, metrics: SchedulerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics._collect()


def _child(family: Histogram, kept: dict[str, Histogram], value: str) -> Histogram:
    """``family``'s histogram for its one label's ``value``, looked up once (see ``SchedulerMetrics._phases``)."""
    child = kept.get(value)
    if child is None:
        child = kept[value] = family.labels(value)
    return child
