"""The connected scheduler: watch cache, leader election and a cycle every second or sooner.

Every replica keeps its cache warm (so a standby that becomes leader
schedules at once, from current state); only the leader runs cycles, and it
checks that it still holds the lease just before each one, so a replica cut
off from the API server stops acting within the renew deadline. A cycle runs
when the cache changed, and at least every ``period_s`` (time alone can
change a decision: a stale gang's grace runs out).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.bind import Binder
from scheduler.cluster.cache import CacheView, ClusterCache
from scheduler.cluster.cycle import ClusterView, CycleResult, SchedulingCycle
from scheduler.cluster.evict import Evictor
from scheduler.cluster.leader import LeaderElectionConfig, LeaderElector
from scheduler.engine.model import SchedulerConfig

log = get_logger(__name__)

JSON = dict[str, Any]


def cluster_view(view: CacheView) -> ClusterView:
    """The cache's stores in the keys a cycle uses (pods by UID, PodGroups by namespace and name)."""

    def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
        m = obj.get("metadata")
        return m if isinstance(m, dict) else {}

    pods = {str(meta(p).get("uid") or key): p for key, p in view.pods.items()}
    podgroups = {
        (str(meta(g).get("namespace") or ""), str(meta(g).get("name") or "")): g for g in view.podgroups.values()
    }
    return ClusterView(
        nodes=dict(view.nodes), gpunodes=dict(view.gpunodes), pods=pods, queues=dict(view.queues), podgroups=podgroups
    )


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How the connected scheduler runs; every field has a flag (``gpuwarden scheduler --help``)."""

    period_s: float = 1.0
    default_queue: str = "default"
    lease: LeaderElectionConfig = field(default_factory=lambda: LeaderElectionConfig(namespace="gpuwarden"))
    bind_workers: int = 16
    evictions_per_s: float = 10.0
    sync_timeout_s: float = 120.0
    config: SchedulerConfig = field(default_factory=SchedulerConfig)


class SchedulerRunner:
    """One replica of the scheduler: start, run until ``stop`` is set, stop cleanly."""

    def __init__(self, api_client: client.ApiClient, settings: RunnerSettings) -> None:
        self.settings = settings
        self.api = KubeApi(api_client, field_manager=contract.SCHEDULER_COMPONENT)
        self.cache = ClusterCache(api_client)
        self.elector = LeaderElector(
            api_client,
            settings.lease,
            on_started_leading=lambda: log.info("leading", identity=settings.lease.identity),
            on_stopped_leading=lambda: log.warning("stopped_leading", identity=settings.lease.identity),
        )
        self.cycle = SchedulingCycle(
            self.api,
            config=settings.config,
            default_queue=settings.default_queue,
            binder=Binder(self.api, workers=settings.bind_workers),
            evictor=Evictor(self.api, evictions_per_s=settings.evictions_per_s),
        )
        self.cycles = 0
        self.last: CycleResult | None = None

    def run(self, stop: threading.Event) -> None:
        # Syncing 150,000 pods allocates millions of long-lived dicts; the
        # default collector thresholds would spend most of the sync scanning them.
        gc.set_threshold(50_000, 10, 10)
        self.cache.start()
        self.elector.start()
        try:
            if not self.cache.wait_synced(self.settings.sync_timeout_s):
                log.warning("cache_not_synced", timeout_s=self.settings.sync_timeout_s)
            gc.freeze()  # what the first sync built lives long: keep it out of every later collection
            generation = -1
            while not stop.is_set():
                generation = self.cache.wait_for_change(generation, self.settings.period_s)
                if stop.is_set() or not self.elector.is_leader():
                    continue
                view = self.cache.view()
                if not view.synced:
                    continue
                try:
                    self.last = self.cycle.run(cluster_view(view))
                    self.cycles += 1
                except Exception:
                    # A bug in one cycle must not end scheduling: log, and try the next.
                    log.exception("cycle_failed")
        finally:
            self.elector.stop()
            self.cache.stop()
