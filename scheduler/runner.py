"""The connected scheduler: watch cache, leader election and a cycle every second or sooner.

Every replica keeps its cache warm (so a standby that becomes leader
schedules at once, from current state); only the leader runs cycles, and it
checks that it still holds the lease just before each one, so a replica cut
off from the API server stops acting within the renew deadline. A cycle runs
when the cache changed, and at least every ``period_s`` (time alone can
change a decision: a stale gang's grace runs out).

``/healthz`` asks one thing: is the loop still turning? A leader that has
not finished a cycle, or a standby that has not finished a loop turn, within
``stall_s`` is hung and the kubelet should restart it. An API server that is
down is not a hang: the loop keeps turning (the cycle waits for a synced
cache and the lease), and a cycle whose API calls keep finishing, answered
or failed, is slow, not stuck. ``/readyz`` passes once the cache synced, so
a rollout waits for the new replica to hold the cluster's state.

This module wires the process together, so it sits above every package it
joins: the cluster I/O (``scheduler.cluster``), the engine under it, and
remediation (``scheduler.remediation``, which itself uses the cluster's
conversion and eviction). Kept inside ``scheduler.cluster`` it made that
package import remediation, which imports it back.
"""

from __future__ import annotations

import gc
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubernetes import client

from gpuwarden import contract
from gpuwarden.http import HealthServer
from gpuwarden.kube import KubeApi, RequestStats
from gpuwarden.logconfig import get_logger
from gpuwarden.serving import MetricsSecurity, build_server
from scheduler.cluster.assumed import AssumedBinds, AssumedEvictions
from scheduler.cluster.bind import Binder
from scheduler.cluster.cache import (
    DEVICECLASSES,
    DEVICETAINTRULES,
    GPUNODES,
    NODES,
    PODGROUPS,
    PODS,
    QUEUES,
    RESOURCECLAIMS,
    RESOURCESLICES,
    CacheView,
    ClusterCache,
    default_resources,
)
from scheduler.cluster.cycle import (
    BACKGROUND_WRITERS,
    BOOKKEEPING_MAX_DEFER_S,
    BOOKKEEPING_QPS,
    ClusterView,
    CycleResult,
    SchedulingCycle,
    ViewChanges,
)
from scheduler.cluster.evict import DEFAULT_EVICT_WORKERS, Evictor, refused_pods
from scheduler.cluster.fence import LeaseFence, LeaseLostError
from scheduler.cluster.leader import LeaderElectionConfig, LeaderElector
from scheduler.cluster.metrics import SchedulerMetrics
from scheduler.cluster.sliceadmission import DEFAULT_RUNTIME_CLASS, SliceAdmission
from scheduler.cluster.sliceconfig import SliceCompute, SliceConfigWriter
from scheduler.cluster.status import STATUS_WORKERS
from scheduler.cluster.versions import Versioned
from scheduler.collector import LoopCollector
from scheduler.engine.model import SchedulerConfig
from scheduler.remediation.controller import NODE_PATCH_WORKERS, RemediationController
from scheduler.remediation.devicetaints import DeviceTaintPublisher
from scheduler.remediation.metrics import RemediationMetrics
from scheduler.remediation.policy import ControllerSettings
from scheduler.remediation.worker import RemediationWorker

log = get_logger(__name__)

# The cyclic collector's thresholds in the scheduler process until its cache
# synced (the loop collects from then on, see scheduler.collector). Syncing
# 150,000 pods allocates millions of long-lived dicts; Python's default (700)
# would spend most of the sync scanning them young
# (benchmarks/scheduler_cache.py).
GC_THRESHOLDS = (50_000, 10, 10)
# The scheduler process's default RunnerSettings.quiet_settle_s: under
# single-pod churn the quiet changes after a bind (its echo, the pod
# starting) come within about 10 ms, so one cycle folds them in, well before
# the next arrival (about 50 ms apart at 20 pods a second).
QUIET_SETTLE_S = 0.02
# ... and at least this many times as long as the last cycle took, so that
# cycles for quiet changes alone take at most a fifth of the loop's time: at
# 5,000 nodes a cycle takes about 0.1 s and the kubelets' status writes
# never pause, so a fixed 20 ms would keep the loop cycling for them.
QUIET_SETTLE_CYCLES = 4.0
# How long a thread may hold the GIL while another waits for it. The loop
# spends a cycle's few milliseconds on the CPU but keeps giving the GIL up
# (each bind it writes, each wait for the cache), and every time it wants it
# back it queued behind whichever writer or watch thread was decoding, for up
# to the interpreter's default of 5 ms: a bind's whole latency, twice over.
# A shorter slice costs the background threads a few more switches.
SWITCH_INTERVAL_S = 0.0005

JSON = dict[str, Any]


K = TypeVar("K")


def _pod_slot(key: str, pod: Mapping[str, Any]) -> str:
    """A pod's key in a :class:`ClusterView`: its UID (its cache key if it has none)."""
    m = pod.get("metadata")
    uid = m.get("uid") if isinstance(m, dict) else None
    return uid if isinstance(uid, str) and uid else str(uid or key)


def _group_slot(key: str, group: Mapping[str, Any]) -> tuple[str, str]:
    m = group.get("metadata")
    meta = m if isinstance(m, dict) else {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class _Rekeyed(Generic[K]):
    """One store under the cycle's keys, with the cache key each entry came from."""

    def __init__(self, slot_of: Callable[[str, JSON], K]) -> None:
        self.entries: dict[K, JSON] = {}
        self._slot_of = slot_of
        self._slots: dict[str, K] = {}  # cache key -> the cycle's key
        self._owner: dict[K, str] = {}  # the cycle's key -> the cache key holding it

    def put(self, key: str, obj: JSON) -> K:
        slot = self._slot_of(key, obj)
        self.entries[slot] = obj
        self._slots[key] = slot
        self._owner[slot] = key
        return slot

    def update(self, store: Mapping[str, JSON], keys: Iterable[str]) -> frozenset[K]:
        """Take the entries of ``keys`` from ``store`` again; the cycle's keys that changed."""
        changed: set[K] = set()
        for key in keys:
            slot = self._slots.pop(key, None)
            if slot is not None and self._owner.get(slot) == key:
                del self.entries[slot]
                del self._owner[slot]
                changed.add(slot)
            obj = store.get(key)
            if obj is not None:
                changed.add(self.put(key, obj))
        return frozenset(changed)


class ClusterViews:
    """Cluster views from cache views, re-keyed by what changed since the previous one.

    A cycle wants pods by UID and PodGroups by (namespace, name), the cache
    keys both by ``namespace/name``. Re-keying 150,000 pods every cycle
    costs more than the rest of a quiet cycle, so the re-keyed stores are
    kept, and a view that names what changed since the previous one
    (:meth:`ClusterCache.view` with ``since``) updates only those entries.
    Each view also carries those changes in its own keys
    (:class:`~scheduler.cluster.cycle.ViewChanges`) for the cycle.
    """

    def __init__(self) -> None:
        self.generation: int | None = None
        self._pods = _Rekeyed(_pod_slot)
        self._groups = _Rekeyed(_group_slot)
        self._group_versions = Versioned(self._groups.entries)

    def take(self, cache: ClusterCache) -> CacheView:
        """The cache's view since the last one this made a cluster view of: its pods and PodGroups only as changed."""
        return cache.view(since=self.generation, partial=(PODS, PODGROUPS))

    def next(self, view: CacheView) -> ClusterView:
        """The cluster view of ``view``; it says what changed when ``view`` was taken since :attr:`generation`."""
        changed = view.changed if self.generation is not None and view.since == self.generation else None
        if changed is None and view.partial:
            raise ValueError(f"a view of the changes since generation {view.since} continues no view taken here")
        self.generation = None
        changes: ViewChanges | None = None
        if changed is None:
            self._pods = _Rekeyed(_pod_slot)
            self._groups = _Rekeyed(_group_slot)
            for key, pod in view.pods.items():
                self._pods.put(key, pod)
            for key, group in view.podgroups.items():
                self._groups.put(key, group)
            self._group_versions = Versioned(self._groups.entries)
        else:
            assert view.since is not None
            groups_changed = self._groups.update(view.podgroups, changed.get(PODGROUPS, ()))
            self._group_versions.changed(groups_changed)
            changes = ViewChanges(
                since=view.since,
                nodes=changed.get(NODES, frozenset()),
                gpunodes=changed.get(GPUNODES, frozenset()),
                pods=self._pods.update(view.pods, changed.get(PODS, ())),
                queues=changed.get(QUEUES, frozenset()),
                podgroups=groups_changed,
                resource_slices=changed.get(RESOURCESLICES, frozenset()),
                device_taint_rules=changed.get(DEVICETAINTRULES, frozenset()),
                resource_claims=changed.get(RESOURCECLAIMS, frozenset()),
                device_classes=changed.get(DEVICECLASSES, frozenset()),
            )
        self.generation = view.generation
        return ClusterView(
            nodes=view.nodes,
            gpunodes=view.gpunodes,
            # Not a copy (every pod, every cycle, was a fifth of the loop's
            # CPU at 11,000 pods): the next call changes it. Read it on the
            # loop's thread during the cycle; a thread that keeps it copies it
            # (the remediation worker's offer does). The PodGroups are a
            # version that stays as it is (the status writer reads them
            # behind the cycles), made at the cost of what changed.
            pods=self._pods.entries,
            queues=view.queues,
            podgroups=self._group_versions.freeze(),
            generation=view.generation,
            changed=changes,
            claims=view.claims,
            volumes=view.volumes,
            resource_slices=view.resource_slices,
            device_taint_rules=view.device_taint_rules,
            resource_claims=view.resource_claims,
            device_classes=view.device_classes,
            missing=view.missing,
        )


def cluster_view(view: CacheView) -> ClusterView:
    """The cache's stores in the keys a cycle uses (pods by UID, PodGroups by namespace and name), all re-keyed.

    What :class:`ClusterViews` keeps current by changes, built from scratch.
    """

    def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
        m = obj.get("metadata")
        return m if isinstance(m, dict) else {}

    pods: dict[str, JSON] = {}
    for key, pod in view.pods.items():  # once per pod per cycle: kept to plain look-ups
        m = pod.get("metadata")
        uid = m.get("uid") if isinstance(m, dict) else None
        pods[uid if isinstance(uid, str) and uid else str(uid or key)] = pod
    podgroups = {
        (str(meta(g).get("namespace") or ""), str(meta(g).get("name") or "")): g for g in view.podgroups.values()
    }
    return ClusterView(
        nodes=dict(view.nodes),
        gpunodes=dict(view.gpunodes),
        pods=pods,
        queues=dict(view.queues),
        podgroups=podgroups,
        claims=dict(view.claims),
        volumes=dict(view.volumes),
        resource_slices=dict(view.resource_slices),
        device_taint_rules=dict(view.device_taint_rules),
        resource_claims=dict(view.resource_claims),
        device_classes=dict(view.device_classes),
        missing=view.missing,
    )


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How the connected scheduler runs; every field has a flag (``gpuwarden scheduler --help``)."""

    period_s: float = 1.0
    # How long an idle leader waits, and how old the first quiet change must
    # be, before it runs a cycle for the quiet changes alone (at least
    # QUIET_SETTLE_CYCLES times the last cycle; ClusterCache.wait_for_change).
    # None: they wait for the next waking change or the period.
    quiet_settle_s: float | None = QUIET_SETTLE_S
    default_queue: str = "default"
    lease: LeaderElectionConfig = field(default_factory=lambda: LeaderElectionConfig(namespace="gpuwarden"))
    bind_workers: int = 16
    # How long a busy scheduler holds back bookkeeping writes that say
    # nothing the pods do not (SchedulingCycle._podgroups_to_create).
    bookkeeping_defer_s: float = BOOKKEEPING_MAX_DEFER_S
    # PodGroup creates and status patches per second behind the cycles (0: unpaced).
    bookkeeping_qps: float = BOOKKEEPING_QPS
    # Whether a GPU slice's ConfigMap also caps its share of the SMs (sliceconfig).
    slice_compute: SliceCompute = SliceCompute.NONE
    # The runtime class the webhook gives slice pods (its --runtime-class); None: it gives none.
    slice_runtime_class: str | None = DEFAULT_RUNTIME_CLASS
    evictions_per_s: float = 10.0
    # Remediation's drains have a budget of their own (None: at evictions_per_s).
    remediation_evictions_per_s: float | None = None
    sync_timeout_s: float = 120.0
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    # None: no HTTP endpoint (tests that need none); 0 picks a free port.
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    # Plain HTTP by default; TLS and delegated authorization on request (gpuwarden.serving).
    metrics_security: MetricsSecurity = field(default_factory=MetricsSecurity)
    # Seconds without a finished cycle (leader) or loop turn (standby) after
    # which /healthz fails; generous, since a cycle at 150,000 pods takes seconds.
    stall_s: float = 60.0
    # Remediation of sick nodes after each cycle (leader only); None: off.
    # Its own dry_run setting records and reports without changing anything.
    remediation: ControllerSettings | None = field(default_factory=ControllerSettings)


def connections_needed(settings: RunnerSettings) -> int:
    """The most connections the process uses at once, for the API client's pool.

    Each watch holds one for as long as it runs; the binds, the background
    status writes, both evictors (the cycle's and remediation's) and
    remediation's Node patches each send from their own threads; the lease
    and the odd read take a few more. A connection handed back to a full
    pool is closed (urllib3 warns "Connection pool is full" at every one,
    as at shutdown when all come back at once), and the next request pays
    for a new TLS handshake.
    """
    senders = settings.bind_workers + STATUS_WORKERS + 2 * DEFAULT_EVICT_WORKERS + NODE_PATCH_WORKERS
    return senders + len(default_resources()) + 4


class SchedulerRunner:
    """One replica of the scheduler: start, run until ``stop`` is set, stop cleanly.

    Every write it makes passes the lease fence (:mod:`.fence`). What it keeps
    from cycle to cycle (the watch cache, the cycle's grouping, statuses and
    engine state, remediation's records, the binds not yet watched) belongs
    to one term of leadership: when the lease is lost, or may have been, all
    of it is dropped and built again from the API, so a leader that was
    paused acts on nothing it believed before the pause.
    """

    def __init__(self, api_client: client.ApiClient, settings: RunnerSettings) -> None:
        self.settings = settings
        self._api_client = api_client
        # One set of request counts for every request the process makes
        # (executors, watches, the lease), as the metrics and alerts expect.
        stats = RequestStats()
        self.elector = LeaderElector(
            api_client,
            settings.lease,
            on_started_leading=self._started_leading,
            on_stopped_leading=lambda: log.warning("stopped_leading", identity=settings.lease.identity),
            stats=stats,
        )
        self.fence = LeaseFence(self.elector)
        self.api = KubeApi(
            api_client, field_manager=contract.SCHEDULER_COMPONENT, stats=stats, write_guard=self.fence.check
        )
        self.cache = ClusterCache(api_client, stats=self.api.stats)
        self.cycles = 0
        # How often this replica dropped what it kept because the lease was or may have been lost.
        self.resets = 0
        self.last: CycleResult | None = None
        self.metrics = SchedulerMetrics(self.api.stats, leader=self.elector.is_leader, synced=self.readiness_synced)
        window = settings.remediation.machine.repeat_window_s if settings.remediation is not None else 7 * 86400.0
        self.remediation_metrics = RemediationMetrics(
            self.metrics.registry, leader=self.elector.is_leader, repeat_window_s=window
        )
        # Cyclic garbage collection once the cache synced: between cycles, on
        # the loop's thread. One for the process's life, kept across resets.
        self.collector = LoopCollector()
        # How many bind connections were open once the last term's were opened (None: never led).
        self.connections_open: int | None = None
        self._fresh_state()
        # Called with every cycle's result, in the loop's thread (the demo times the cycles with it).
        self.on_cycle: Callable[[CycleResult], None] | None = None
        self.server: HealthServer | None = None
        if settings.metrics_port is not None:
            self.server = build_server(
                self.metrics.registry,
                settings.metrics_security,
                host=settings.metrics_host,
                port=settings.metrics_port,
                liveness=self.liveness,
                readiness=self.readiness,
                api_client=api_client,
                field_manager=contract.SCHEDULER_COMPONENT,
                hosts=[socket.gethostname()],
            )
        # Monotonic times: when the loop started (None while the first sync
        # runs), when it last finished a turn, and when the running cycle began.
        self._loop_started: float | None = None
        self._last_turn = time.monotonic()
        self._cycle_since: float | None = None
        # The term the kept state belongs to (None: it has acted in none yet).
        self._term: int | None = None

    def _started_leading(self) -> None:
        """The term's first binds find their connections open (:meth:`.KubeApi.open_connections`).

        On a thread of its own: connecting may take as long as the API
        timeout when the API server is away, and the elector's thread must
        be free to renew the lease meanwhile.
        """
        log.info("leading", identity=self.settings.lease.identity)

        def connect() -> None:
            self.connections_open = self.api.open_connections(self.settings.bind_workers)
            log.debug("connections_opened", count=self.connections_open)

        threading.Thread(target=connect, name="open-connections", daemon=True).start()

    def _fresh_state(self) -> None:
        """Everything a term keeps from cycle to cycle, new: the executors, the cycle, remediation."""
        settings = self.settings
        evictor = Evictor(self.api, evictions_per_s=settings.evictions_per_s, holder=self.fence.token)
        self.cycle = SchedulingCycle(
            self.api,
            config=settings.config,
            default_queue=settings.default_queue,
            binder=Binder(
                self.api,
                workers=settings.bind_workers,
                prebind=SliceConfigWriter(self.api, settings.slice_compute, holder=self.fence.token),
                holder=self.fence.token,
            ),
            evictor=evictor,
            writes_in_background=True,
            writers=BACKGROUND_WRITERS,
            bookkeeping_max_defer_s=settings.bookkeeping_defer_s,
            bookkeeping_qps=settings.bookkeeping_qps,
            slice_admission=SliceAdmission(settings.slice_runtime_class),
            binds_in_background=True,
        )
        # Remediation evicts from a bucket of its own: its passes run on their own
        # thread, and a drain of a full node must not leave the cycle's next
        # reclaim (and the binds behind it) waiting for tokens, nor a storm of
        # reclaims keep a sick node's pods on it.
        self.remediation = (
            RemediationController(
                self.api,
                Evictor(
                    self.api,
                    evictions_per_s=settings.remediation_evictions_per_s or settings.evictions_per_s,
                    holder=self.fence.token,
                ),
                settings.remediation,
            )
            if settings.remediation is not None
            else None
        )
        if self.remediation is not None:
            self.remediation.on_report = self.remediation_metrics.observe
        # Its passes run beside the cycles, never before a bind (see the worker's module).
        self.remediation_worker = (
            RemediationWorker(
                self.remediation,
                DeviceTaintPublisher(self.api, effect=self.remediation.settings.machine.device_taint_effect),
            )
            if self.remediation is not None
            else None
        )
        # Binds made that the watch has not shown yet (see :mod:`.assumed`).
        self.assumed = AssumedBinds()
        # Evictions made that the watch has not shown yet (see :mod:`.assumed`).
        self.evicting = AssumedEvictions()
        self.views = ClusterViews()

    def _reset(self, why: str) -> None:
        """Drop the queued work and all kept state; list the cluster again (see the class docstring).

        The fence is disarmed first, so the writes still queued (background
        status writes, binds of a cycle in flight) fail at the fence instead
        of leaving the process.
        """
        self.fence.disarm()
        log.warning("dropping_kept_state", why=why, term=self._term, identity=self.elector.identity)
        self.resets += 1
        self.cycle.close()
        if self.remediation_worker is not None:
            self.remediation_worker.stop()  # its pass in flight meets the disarmed fence
        self.cache.stop()
        self.cache = ClusterCache(self._api_client, stats=self.api.stats)
        self.cache.start()
        self._fresh_state()
        self._term = None
        # The old cache and kept state are garbage now, frozen long ago: looked at after this turn.
        self.collector.sweep_soon()

    def liveness(self) -> tuple[bool, str]:
        """Fail only when the loop hangs (see the module docstring)."""
        now = time.monotonic()
        if self._loop_started is None:
            return True, "starting: waiting for the cache to sync"
        stall = self.settings.stall_s
        since = self._cycle_since
        if since is not None:
            finished = self.api.stats.last_finished
            progress = max(since, finished) if finished is not None else since
            if now - progress > stall:
                return False, f"cycle running for {now - since:.0f}s with no API request finishing for {stall:.0f}s"
            return True, f"cycle running for {now - since:.1f}s"
        worker = self.remediation_worker
        busy = worker.busy_since if worker is not None else None
        if busy is not None:
            # A pass hung on a webhook or a drain no longer holds the loop, so
            # the loop's own turns do not show it: judged as a cycle would be.
            finished = self.api.stats.last_finished
            progress = max(busy, finished) if finished is not None else busy
            if now - progress > stall:
                return False, f"remediation pass running for {now - busy:.0f}s with no API request finishing"
        idle = now - self._last_turn
        if idle > stall:
            return False, f"scheduling loop stuck: no turn for {idle:.0f}s (limit {stall:.0f}s)"
        return True, f"ok: {self.cycles} cycles, leader={self.elector.is_leader()}"

    def readiness_synced(self) -> bool:
        """Whether the current cache has listed everything (the cache is replaced when the lease is lost)."""
        return self.cache.synced()

    def readiness(self) -> tuple[bool, str]:
        if self.cache.synced():
            return True, "ok: cache synced"
        return False, "cache not synced yet"

    def run(self, stop: threading.Event) -> None:
        gc.set_threshold(*GC_THRESHOLDS)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        if self.server is not None:
            self.server.start()
        self.cache.start()
        self.elector.start()
        try:
            if not self.cache.wait_synced(self.settings.sync_timeout_s):
                log.warning("cache_not_synced", timeout_s=self.settings.sync_timeout_s)
            self.collector.start()  # what the first sync built lives long: frozen, never looked at again
            generation = -1
            self._loop_started = self._last_turn = time.monotonic()
            while not stop.is_set():
                cache = self.cache
                settle = None
                if self._term is not None:
                    # Leading: what the last cycle's view held is done with,
                    # including changes that came after this wait ended.
                    generation = max(generation, self.views.generation or -1)
                    settle = self.settings.quiet_settle_s
                    if settle is not None and self.last is not None:
                        settle = max(settle, QUIET_SETTLE_CYCLES * self.last.seconds)
                generation = cache.wait_for_change(generation, self.settings.period_s, settle_s=settle)
                self._turn(stop)
                # After the cycle's binds went out, never between a placement
                # and its bind; the first cycle's kept state (every job and
                # pod of the cluster) is frozen by its first collection.
                self.collector.between_cycles()
                if self.cache is not cache:
                    generation = -1  # a new cache counts its changes from 0
                self._last_turn = time.monotonic()
        finally:
            self.collector.stop()
            self.cycle.close()  # the writes still queued go out while this replica may still lead
            if self.remediation_worker is not None:
                self.remediation_worker.stop()
            self.fence.disarm()
            self.elector.stop()
            self.cache.stop()
            if self.server is not None:
                self.server.stop()

    def _turn(self, stop: threading.Event) -> None:
        if stop.is_set():
            return
        term = self.fence.current()
        if self._term is not None and term != self._term:
            # Lost, or lost and taken again while this loop was not looking
            # (a pause): nothing kept from the old term may be acted on. The
            # fence is armed for the new term only after the old term's
            # queued writes have met it disarmed.
            self._reset("the lease was lost" if term is None else "the lease was lost and taken again")
            return
        self.fence.arm(term)
        if term is None:
            return
        began = time.monotonic()
        view = self.views.take(self.cache)
        if not view.synced:
            return
        self._term = term
        self._cycle_since = time.monotonic()
        current = self.evicting.overlay(self.assumed.overlay(self.views.next(view)))
        viewed = time.monotonic() - began
        try:
            self.last = self.cycle.run(current)
            # Whether the end of a running pod must wake the loop (see ClusterCache.room_wanted).
            self.cache.room_wanted = bool(self.last.decisions.pending or self.last.reservations)
            self.assumed.record(self.last)
            self.evicting.record(self.last)
            self.cycles += 1
            self.metrics.observe(self.last, view_seconds=viewed)
            self.remediation_metrics.lost(self.last.lost_gpu_seconds)
            if self.on_cycle is not None:
                self.on_cycle(self.last)
        except LeaseLostError as lost:
            self._cycle_since = None
            self._reset(f"a write of the cycle was fenced: {lost}")
            return
        except Exception:
            # A bug in one cycle must not end scheduling: log, and try the next.
            self.cache.room_wanted = True
            log.exception("cycle_failed")
            self.metrics.cycle_failed()
        finally:
            self._cycle_since = None
        worker = self.remediation_worker
        if worker is not None:
            if worker.fenced is not None:
                self._reset(f"a remediation write was fenced: {worker.fenced}")
                return
            worker.offer(current, refused_pods(self.last.evictions) if self.last is not None else {})
