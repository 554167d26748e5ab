"""One scheduling cycle against a real cluster: watched objects in, API calls out.

The order is the one that keeps the cluster consistent when a step fails:

1. Read the cycle's view (raw Nodes, GPUNodes, Pods, Queues, PodGroups).
2. Group pods: a pod of ours names its PodGroup, or gets one derived from its
   owners (:mod:`.grouping`, :mod:`.owners`); a derived PodGroup is created
   so that ``kubectl get podgroups`` and the status writer have an object.
   Scheduling needs only the derived spec, so the creates go out after the
   binds, many at once: 4,000 new bare pods do not wait on 4,000 creates.
3. Build the engine's Snapshot (:mod:`.convert`) and run one session.
4. Evict first (:mod:`.evict`), then bind (:mod:`.bind`): a bind pipelined
   behind an eviction waits until the evicted pod is gone, so room is never
   double-booked.
5. Write PodGroup and Queue status and the pending Events (:mod:`.status`).
   With ``writes_in_background`` (the runner's choice) steps 2's creates and
   5 run in a thread while the next cycles place and bind: their binds need
   none of them. Batches are written one after another, in cycle order, and
   a cycle waits only when ``MAX_QUEUED_WRITES`` are still to be written.

A malformed Queue or PodGroup is logged once and left out; it never stops the
cycle for everyone else. The engine sees none of this: it gets a Snapshot.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden import contract
from gpuwarden.kube import ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.bind import Binder, BindResult
from scheduler.cluster.convert import GroupInfo, is_external_queue, snapshot_from
from scheduler.cluster.evict import Evictor, EvictResult
from scheduler.cluster.grouping import GroupSpec, derive_group
from scheduler.cluster.logonce import WarnOnce
from scheduler.cluster.owners import OwnerResolver
from scheduler.cluster.queues import podgroup_spec, queue_from_object
from scheduler.cluster.status import StatusWriter
from scheduler.engine.model import Decisions, Queue, SchedulerConfig, Snapshot, TaskStatus
from scheduler.engine.session import run_session

log = get_logger(__name__)
warn = WarnOnce(__name__)

# Cycles whose writes may wait behind the one being written: enough that a
# fill does not stall its binds on bookkeeping, few enough that statuses
# stay close to current when writes cannot keep up.
MAX_QUEUED_WRITES = 4

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The objects one cycle schedules from, as the API server returned them.

    ``pods`` is keyed by UID, ``podgroups`` by (namespace, name), the rest by
    name. The watch cache hands out one per cycle; a test can list them.
    """

    nodes: Mapping[str, JSON] = field(default_factory=dict)
    gpunodes: Mapping[str, JSON] = field(default_factory=dict)
    pods: Mapping[str, JSON] = field(default_factory=dict)
    queues: Mapping[str, JSON] = field(default_factory=dict)
    podgroups: Mapping[tuple[str, str], JSON] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CycleResult:
    snapshot: Snapshot
    decisions: Decisions
    binds: tuple[BindResult, ...]
    evictions: tuple[EvictResult, ...]
    seconds: float
    # Seconds per session phase (build, each action, decisions): the metrics
    # show which phase a slow cycle spent its time in.
    session_seconds: Mapping[str, float] = field(default_factory=dict)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _is_ours(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, dict) and spec.get("schedulerName") == contract.SCHEDULER_NAME


def _pod_priority(pod: Mapping[str, Any]) -> int:
    # The Priority admission plugin resolves priorityClassName into
    # spec.priority when the pod is created, so the class itself need not be read.
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class SchedulingCycle:
    """Runs cycles over views; keeps what must survive from one cycle to the next.

    That is: when a running gang was first seen short of its minMember (for
    stale-gang eviction), the PodGroups it already created, and the executors
    (whose rate limits and last-written statuses span cycles).
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        config: SchedulerConfig | None = None,
        default_queue: str = "default",
        binder: Binder | None = None,
        evictor: Evictor | None = None,
        status: StatusWriter | None = None,
        owners: OwnerResolver | None = None,
        clock: Callable[[], float] = time.time,
        writers: int = 16,
        writes_in_background: bool = False,
    ) -> None:
        self._api = api
        self._config = config or SchedulerConfig()
        self._default_queue = default_queue
        self.binder = binder or Binder(api)
        self.evictor = evictor or Evictor(api)
        self.status = status or StatusWriter(api)
        self._owners = owners or OwnerResolver(api)
        self._clock = clock
        self._short_since: dict[str, float] = {}
        self._created_groups: set[tuple[str, str]] = set()
        # Derived PodGroups this cycle found missing, created after its binds.
        self._to_create: dict[tuple[str, str], GroupSpec] = {}
        self._writers = writers
        self._background = ThreadPoolExecutor(1, thread_name_prefix="cycle-writes") if writes_in_background else None
        self._writing: deque[Future[None]] = deque()
        # Derived PodGroups handed to the background writer and not yet created.
        self._queued: set[tuple[str, str]] = set()

    # -- inputs ---------------------------------------------------------------

    def _queues(self, view: ClusterView) -> list[Queue]:
        queues: list[Queue] = []
        for name, obj in sorted(view.queues.items()):
            parsed = queue_from_object(obj)
            if isinstance(parsed, str):
                warn.warning("queue_invalid", ("queue", name, parsed), queue=name, problem=parsed)
                continue
            queues.append(parsed)
        return queues

    def _explicit_groups(self, view: ClusterView) -> dict[tuple[str, str], GroupInfo]:
        groups: dict[tuple[str, str], GroupInfo] = {}
        for key, obj in view.podgroups.items():
            spec = podgroup_spec(obj)
            if isinstance(spec, str):
                warn.warning("podgroup_invalid", ("podgroup", key, spec), podgroup="/".join(key), problem=spec)
                continue
            groups[key] = GroupInfo(
                queue=spec.queue,
                min_member=spec.min_member,
                preemptible=spec.preemptible,
                uid=str(_meta(obj).get("uid") or ""),
            )
        return groups

    def _derived(self, pod: Mapping[str, Any]) -> GroupSpec:
        return derive_group(pod, self._owners.chain(pod), default_queue=self._default_queue)

    def _ensure_podgroup(self, spec: GroupSpec) -> None:
        """Create the PodGroup a derived group needs (once; it is owned by the workload)."""
        key = (spec.namespace, spec.name)
        if key in self._created_groups:
            return
        body: JSON = {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.PODGROUP_KIND,
            "metadata": {"name": spec.name, "namespace": spec.namespace},
            "spec": {"minMember": spec.min_member, "queue": spec.queue},
        }
        if spec.priority_class_name:
            body["spec"]["priorityClassName"] = spec.priority_class_name
        if spec.owner is not None:
            body["metadata"]["ownerReferences"] = [spec.owner.to_json()]
        try:
            self._api.create_podgroup(spec.namespace, body)
        except ApiError as exc:
            if exc.status != 409:  # 409: it exists (created by an earlier cycle or a previous leader)
                warn.warning(
                    "podgroup_create_failed",
                    ("podgroup-create", key),
                    podgroup=f"{spec.namespace}/{spec.name}",
                    status=exc.status,
                    error=exc.detail,
                )
                return
        self._created_groups.add(key)

    def flush(self) -> None:
        """Wait until the writes of the cycles run so far are done (at once without ``writes_in_background``)."""
        self._reap(keep=0)

    def _reap(self, keep: int) -> None:
        """Forget finished write batches; wait for the oldest until at most ``keep`` are unfinished."""
        while self._writing and (self._writing[0].done() or len(self._writing) > keep):
            error = self._writing.popleft().exception()
            if error is not None:
                log.error("cycle_writes_failed", error=repr(error))

    def close(self) -> None:
        """Finish the writes in flight and stop the background writer."""
        self.flush()
        if self._background is not None:
            self._background.shutdown()

    def _after_binds(self, specs: list[GroupSpec], decisions: Decisions, gang_met: list[str]) -> None:
        try:
            self._create_podgroups(specs)
        finally:
            # Created, or to be tried again by the next cycle that finds it missing.
            self._queued.difference_update((s.namespace, s.name) for s in specs)
        self.status.write(decisions, gang_met=gang_met)

    def _create_podgroups(self, specs: list[GroupSpec]) -> None:
        """Create the derived PodGroups found missing, from a pool of threads (each create is one round trip)."""
        if len(specs) <= 1:
            for spec in specs:
                self._ensure_podgroup(spec)
            return
        with ThreadPoolExecutor(max_workers=min(self._writers, len(specs)), thread_name_prefix="podgroup") as pool:
            list(pool.map(self._ensure_podgroup, specs))

    def _group_pods(
        self, view: ClusterView
    ) -> tuple[dict[tuple[str, str], GroupInfo], dict[str, str], dict[tuple[str, str], list[Mapping[str, Any]]]]:
        groups = self._explicit_groups(view)
        by_uid: dict[str, str] = {}
        members: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for uid, pod in view.pods.items():
            if not _is_ours(pod):
                continue
            meta = _meta(pod)
            namespace = str(meta.get("namespace") or "default")
            annotations = meta.get("annotations") or {}
            named = annotations.get(contract.ANNOTATION_POD_GROUP) if isinstance(annotations, dict) else None
            if isinstance(named, str) and named:
                key = (namespace, named)
            else:
                derived = self._derived(pod)
                key = (derived.namespace, derived.name)
                by_uid[uid] = derived.name
                if key not in view.podgroups and key not in self._created_groups:
                    self._to_create.setdefault(key, derived)
                groups.setdefault(key, GroupInfo(queue=derived.queue, min_member=derived.min_member))
            members.setdefault(key, []).append(pod)
        # A group's priority is its pods' (they share a priority class).
        for key, pods in members.items():
            info = groups.get(key)
            if info is not None:
                groups[key] = replace(info, priority=max(_pod_priority(p) for p in pods))
        return groups, by_uid, members

    def _track_short_gangs(self, snapshot: Snapshot, now: float) -> Snapshot:
        """Date when each running gang first fell below minMember (stale-gang eviction needs it)."""
        jobs = []
        seen: set[str] = set()
        for job in snapshot.jobs:
            running = sum(1 for t in job.tasks if t.status is TaskStatus.RUNNING)
            if 0 < running < job.min_member:
                since = self._short_since.setdefault(job.key, now)
                jobs.append(replace(job, below_min_member_since=since))
                seen.add(job.key)
            else:
                jobs.append(job)
        for key in [k for k in self._short_since if k not in seen]:
            del self._short_since[key]
        return replace(snapshot, jobs=tuple(jobs))

    # -- the cycle --------------------------------------------------------------

    def run(self, view: ClusterView) -> CycleResult:
        started = time.monotonic()
        now = self._clock()
        groups, by_uid, _ = self._group_pods(view)
        snapshot = snapshot_from(
            view.nodes,
            view.gpunodes,
            view.pods.values(),
            self._queues(view),
            groups,
            now,
            self._config,
            pod_groups=by_uid,
        )
        snapshot = self._track_short_gangs(snapshot, now)
        timings: dict[str, float] = {}
        decisions = run_session(snapshot, timings)
        evicted = self.evictor.evict_all(decisions.evictions) if decisions.evictions else []
        nodes = {n.name: n for n in snapshot.nodes}
        bound = self.binder.bind_all(decisions.binds, nodes, evictions=decisions.evictions) if decisions.binds else []
        gang_met = [
            job.key
            for job in snapshot.jobs
            if sum(1 for t in job.tasks if t.status is TaskStatus.RUNNING) >= job.min_member
        ]
        shares = tuple(s for s in decisions.queue_shares if not is_external_queue(s.queue))
        pending = tuple(p for p in decisions.pending if not is_external_queue(p.queue))
        written = replace(decisions, queue_shares=shares, pending=pending)
        specs = [s for k, s in self._to_create.items() if k not in self._created_groups and k not in self._queued]
        self._to_create.clear()
        if self._background is None:
            self._after_binds(specs, written, gang_met)
        else:
            self._reap(keep=MAX_QUEUED_WRITES)
            self._queued.update((s.namespace, s.name) for s in specs)
            self._writing.append(self._background.submit(self._after_binds, specs, written, gang_met))
        seconds = time.monotonic() - started
        log.info(
            "cycle_done",
            binds=sum(1 for r in bound if r.ok),
            bind_failures=sum(1 for r in bound if not r.ok),
            evictions=len(evicted),
            pending=len(pending),
            seconds=round(seconds, 3),
        )
        return CycleResult(snapshot, decisions, tuple(bound), tuple(evicted), seconds, timings)
