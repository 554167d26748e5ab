"""One scheduling cycle against a real cluster: watched objects in, API calls out.

The order is the one that keeps the cluster consistent when a step fails:

1. Read the cycle's view (raw Nodes, GPUNodes, Pods, Queues, PodGroups).
2. Group pods: a pod of ours names its PodGroup, or gets one derived from its
   owners (:mod:`.grouping`, :mod:`.owners`); a derived PodGroup is created
   so that ``kubectl get podgroups`` and the status writer have an object
   (a lone pod's group only once it has something to explain).
   Scheduling needs only the derived spec, so the creates go out after the
   binds, many at once: 4,000 new pods of Jobs do not wait on 4,000 creates.
3. Build the engine's Snapshot (:mod:`.convert`) and run one session. A
   pending GPU slice pod that lacks what the admission webhook injects is
   given to the engine as refused (:mod:`.sliceadmission`): never placed,
   its group pending with the reason, the pod with an Event.
4. Evict first (:mod:`.evict`), then bind (:mod:`.bind`): a bind pipelined
   behind an eviction waits until the evicted pod is gone, so room is never
   double-booked. With ``binds_in_background`` (the runner's choice) the
   binds onto free room are sent and not waited for, the first one's
   request written from this thread (:mod:`.inflight`): the runner shows
   their pods bound until the watch does or an answer says the bind failed.
5. Keep the reservations the engine holds on their PodGroups
   (:mod:`.reservations`), less the room a bind has just taken.
6. Write PodGroup and Queue status and the pending Events (:mod:`.status`).
   With ``writes_in_background`` (the runner's choice) step 2's creates and
   step 6 run in a thread while the next cycles place and bind: their binds
   need none of them. A cycle never waits for them: batches that arrive
   while one is being written are merged into one (:mod:`.writebehind`).

A malformed Queue or PodGroup is logged once and left out; it never stops the
cycle for everyone else. A Queue left out is named in the Snapshot with what
is wrong, so its jobs wait saying so, and its status gets an ``Invalid``
condition. The engine sees none of the objects: it gets a Snapshot.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden import contract
from gpuwarden.kube import ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.assemble import SnapshotAssembler
from scheduler.cluster.bind import Binder, BindResult
from scheduler.cluster.cache import RESOURCECLAIMS
from scheduler.cluster.claimbind import ClaimBinder
from scheduler.cluster.claims import ClaimPlan, ClaimStage, DraObjects
from scheduler.cluster.convert import is_external_queue, snapshot_from
from scheduler.cluster.evict import Evictor, EvictOutcome, EvictResult, TokenBucket
from scheduler.cluster.grouping import GroupSpec
from scheduler.cluster.groups import PodGrouper, podgroup_object, spec_fields, waiting
from scheduler.cluster.inflight import BindsInFlight
from scheduler.cluster.logonce import WarnOnce
from scheduler.cluster.lost import gpu_seconds_lost, lost_totals
from scheduler.cluster.misplaced import Misplaced, MisplacedBackoff, MisplacedEvents, misplaced_evictions
from scheduler.cluster.owners import OwnerResolver
from scheduler.cluster.queues import queue_from_object
from scheduler.cluster.reservations import (
    ReservationWriter,
    lists_reservations,
    reservations_by_group,
    reservations_of,
)
from scheduler.cluster.short_gangs import ShortGangs
from scheduler.cluster.sliceadmission import RefusalEvents, SliceAdmission
from scheduler.cluster.status import (
    Finished,
    MembershipChange,
    StatusWriter,
    finished_phase,
    refusals,
    shows_blocked,
)
from scheduler.cluster.ungrouped import (
    UngroupedPodNotifier,
)
from scheduler.cluster.versions import Frozen, Versioned
from scheduler.cluster.volumes import VolumeJudge
from scheduler.cluster.writebehind import WriteBatch, WriteBehind
from scheduler.engine.backlog import BacklogCounts, BacklogMemo
from scheduler.engine.fairshare import build_tree
from scheduler.engine.incremental import Engine
from scheduler.engine.model import (
    Bind,
    Decisions,
    Eviction,
    Job,
    JobStatus,
    Node,
    Queue,
    Reservation,
    SchedulerConfig,
    Snapshot,
    TaskStatus,
)
from scheduler.engine.session import collector_paused, run_session

log = get_logger(__name__)

# How long a busy scheduler may hold back the PodGroups and first statuses
# of groups placed in full (SchedulingCycle._podgroups_to_create): the
# scheduler process's default. A SchedulingCycle made without it (tests,
# tools) writes everything every cycle.
BOOKKEEPING_MAX_DEFER_S = 30.0
# ... and how long no cycle must have bound anything before they are
# written: a cycle between two waves of arriving pods is not a quiet one.
BOOKKEEPING_QUIET_S = 1.0
# The scheduler process's default pace of those writes (PodGroup creates and
# status patches behind the cycles, per second): five times what steady
# arrivals of 20 pods a second need, a fifth of a busy API server's writes.
BOOKKEEPING_QPS = 200.0
# While cycles are binding, the pace is this share of it: the writes held
# back for 30 s of steady arrivals (a create and a status per pod) then go
# out over most of the next 30 s instead of in a few seconds, during which
# every bind waited longer on the shared API server.
BOOKKEEPING_BUSY_SHARE = 0.25
warn = WarnOnce(__name__)
# Threads that write PodGroups and their status behind the cycles (the
# runner's choice). Few: those writes wait for nobody, and every thread that
# holds the GIL between requests takes its turn from the scheduling thread;
# with 16 of them a 30 s flush of deferred bookkeeping held binds up by a
# tenth of a second.
BACKGROUND_WRITERS = 4

JSON = dict[str, Any]

# A slice pod must carry what the webhook injects (its runtime class at the default).
DEFAULT_SLICE_ADMISSION = SliceAdmission()
_SLICE_NOT_ADMITTED = contract.UnschedulableReason.SLICE_NOT_ADMITTED


@dataclass(frozen=True, slots=True)
class ViewChanges:
    """The keys (in :class:`ClusterView`'s keys) that changed since the view of generation ``since``.

    A key is named when its entry was added, replaced or removed; naming one
    that did not change costs a little work and changes nothing.
    """

    since: int
    nodes: frozenset[str] = frozenset()
    gpunodes: frozenset[str] = frozenset()
    pods: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()
    podgroups: frozenset[tuple[str, str]] = frozenset()
    resource_slices: frozenset[str] = frozenset()
    device_taint_rules: frozenset[str] = frozenset()
    resource_claims: frozenset[str] = frozenset()
    device_classes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The objects one cycle schedules from, as the API server returned them.

    ``pods`` is keyed by UID, ``podgroups`` by (namespace, name), the rest by
    name. The watch cache hands out one per cycle; a test can list them.
    ``generation`` and ``changed`` let a cycle that scheduled from the view
    of generation ``changed.since`` read only what changed (entries are
    never changed in place); without them it reads everything.
    """

    nodes: Mapping[str, JSON] = field(default_factory=dict)
    gpunodes: Mapping[str, JSON] = field(default_factory=dict)
    pods: Mapping[str, JSON] = field(default_factory=dict)
    queues: Mapping[str, JSON] = field(default_factory=dict)
    podgroups: Mapping[tuple[str, str], JSON] = field(default_factory=dict)
    generation: int | None = None
    changed: ViewChanges | None = None
    # PersistentVolumeClaims by ``namespace/name``, PersistentVolumes by name.
    claims: Mapping[str, JSON] = field(default_factory=dict)
    volumes: Mapping[str, JSON] = field(default_factory=dict)
    # NVIDIA's DRA driver's ResourceSlices, the DeviceTaintRules and the
    # DeviceClasses by name, ResourceClaims by ``namespace/name``: the
    # cycle's DRA stage (scheduler.cluster.claims) and remediation's device
    # taints read them.
    resource_slices: Mapping[str, JSON] = field(default_factory=dict)
    device_taint_rules: Mapping[str, JSON] = field(default_factory=dict)
    resource_claims: Mapping[str, JSON] = field(default_factory=dict)
    device_classes: Mapping[str, JSON] = field(default_factory=dict)
    # The collections the cache could not read (not served, or a refused
    # optional one): empty there says nothing of what exists.
    missing: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class CycleResult:
    snapshot: Snapshot
    decisions: Decisions
    # What the API server answered to the cycle's binds; with binds in the
    # background, to those of earlier cycles answered since (:mod:`.inflight`).
    binds: tuple[BindResult, ...]
    evictions: tuple[EvictResult, ...]
    seconds: float
    # Seconds per session phase (build, each action, decisions): the metrics
    # show which phase a slow cycle spent its time in.
    session_seconds: Mapping[str, float] = field(default_factory=dict)
    # Reservations held after the cycle (the engine's, less those just bound).
    reservations: tuple[Reservation, ...] = ()
    # GPU-seconds of running work this cycle's health evictions took, per queue.
    lost_gpu_seconds: Mapping[str, float] = field(default_factory=dict)
    # Evictions of whole-GPU pods the kubelet's device manager put on a GPU out of service (:mod:`.misplaced`).
    misplaced: tuple[Misplaced, ...] = ()
    # Seconds per stage of the cycle, to tell where a slow cycle went when
    # the engine was not it: prepare (grouping and the Snapshot), engine
    # (the session), execute (evictions and binds), bookkeeping (PodGroups,
    # reservations, status handed to the background writer). The runner
    # adds the view.
    stage_seconds: Mapping[str, float] = field(default_factory=dict)
    # What the session's backlog memo spared it (scheduler.engine.backlog);
    # None without one (the full-rebuild path).
    backlog: BacklogCounts | None = None
    # The binds sent in the background and not answered yet (:mod:`.inflight`).
    sent: tuple[Bind, ...] = ()
    # The snapshot's nodes by name, as the cycle indexed them for its binds
    # (kept while no node changes); empty: index the snapshot's nodes.
    nodes_by_name: Mapping[str, Node] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Executed:
    """What :meth:`SchedulingCycle._execute` did: evictions attempted, binds answered, binds sent and their futures."""

    attempted: list[EvictResult]
    bound: list[BindResult]
    sent: tuple[Bind, ...] = ()
    sending: tuple[Future[BindResult], ...] = ()


def _freed_only(held: tuple[Reservation, ...], unsent: Sequence[Eviction]) -> tuple[Reservation, ...]:
    """``held`` without the room that evictions the rate deferred were to free.

    Nothing of it is freeing (the rate defers a beneficiary's victims
    together): held, the next cycle would find the victims still running
    there, let the reservation lapse and plan the evictions afresh anyway,
    having kept the room from everyone for a cycle. Dropped, the next
    cycle plans them afresh at once. A consolidation's deferred move also
    takes back the room kept for the moved pod's job.
    """
    lost = {(ev.beneficiary, ev.node) for ev in unsent if ev.beneficiary is not None}
    moved = {ev.job for ev in unsent if ev.action is contract.EvictionAction.CONSOLIDATE}
    return tuple(r for r in held if (r.job, r.node) not in lost and r.job not in moved)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _group_key(job: str) -> tuple[str, str]:
    """A job key (``namespace/name``) as the key of its PodGroup."""
    namespace, _, name = job.partition("/")
    return namespace, name


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


class SchedulingCycle:
    """Runs cycles over views; keeps what must survive from one cycle to the next.

    That is: when a running gang was first seen short of its minMember (for
    stale-gang eviction), the PodGroups it already created, the executors
    (whose rate limits and last-written statuses span cycles), and what was
    read and converted of each cache entry (:mod:`.assemble`), so that a
    cycle converts only the objects that changed since the last.

    Given a view that says what changed since the one it last scheduled
    from, a cycle also groups only the pods that changed: it keeps each
    group's members and their priorities, and hands the assembler the
    groups and pods whose grouping changed. Pods whose group is derived
    from their owners are grouped again every cycle, since an owner can
    change (or become readable) without the pod changing.
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
        reservations: ReservationWriter | None = None,
        owners: OwnerResolver | None = None,
        clock: Callable[[], float] = time.time,
        incremental: bool = True,
        writers: int = 16,
        writes_in_background: bool = False,
        bookkeeping_max_defer_s: float = 0.0,
        bookkeeping_quiet_s: float = BOOKKEEPING_QUIET_S,
        bookkeeping_qps: float = 0.0,
        slice_admission: SliceAdmission | None = DEFAULT_SLICE_ADMISSION,
        binds_in_background: bool = False,
    ) -> None:
        self._api = api
        # What a pending GPU slice pod must carry to be placed (None: not checked).
        self._admission = slice_admission
        self.refusals = RefusalEvents(api)
        self._config = config or SchedulerConfig()
        self._default_queue = default_queue
        self.binder = binder or Binder(api)
        # Pods with DRA claims: their devices, and the allocations their binds write.
        self.claims = ClaimStage()
        self.binder.use_claims(ClaimBinder(api, self._claim_plans, holder=self.binder.holder))
        # With binds in the background (the runner's choice) the cycle sends
        # its binds onto free room and goes on (:mod:`.inflight`).
        self.inflight = BindsInFlight(self.binder) if binds_in_background else None
        self.evictor = evictor or Evictor(api)
        # With writes in the background, their PodGroup creates and status
        # patches go out at most ``bookkeeping_qps`` a second (0: unpaced):
        # the deferred bookkeeping of 30 s of arrivals, a thousand writes,
        # spread over seconds instead of taking the API server (on a busy
        # control plane, its CPU) from the binds all at once.
        self._bucket = (
            TokenBucket(bookkeeping_qps, max(1, int(bookkeeping_qps / 10)))
            if writes_in_background and bookkeeping_qps > 0
            else None
        )
        busy_qps = bookkeeping_qps * BOOKKEEPING_BUSY_SHARE
        self._busy_bucket = TokenBucket(busy_qps, max(1, int(busy_qps / 10))) if self._bucket is not None else None
        # Set by close: what is still queued then goes out at once (a
        # stopping process drains; after a lost lease every write is refused
        # at the fence, and pacing a thousand refusals would only hold up the
        # replica's fresh start).
        self._closing = False
        self._pace = self._take_token if self._bucket is not None else None
        self.status = status or StatusWriter(api, workers=writers, pace=self._pace)
        self.reservations = reservations or ReservationWriter(api)
        self.ungrouped = UngroupedPodNotifier(api)
        self.misplaced = MisplacedEvents(api)
        self.backoff = MisplacedBackoff()
        self._owners = owners or OwnerResolver(api)
        self._clock = clock
        self._short_gangs = ShortGangs()
        # Conversions made once per cache entry, reused while the entry is unchanged.
        # ``incremental=False`` converts everything every cycle (snapshot_from),
        # the reference the benchmarks compare against.
        self._incremental = incremental
        # Which pod is in which group, kept from view to view (:mod:`.groups`).
        self.grouper = PodGrouper(self._owners, default_queue=default_queue, incremental=incremental)
        self._snapshots = SnapshotAssembler(slice_admission)
        self._volumes = VolumeJudge()
        # The engine's working state kept from session to session (undone
        # and updated by the jobs and nodes that changed) when incremental,
        # with what its sessions learned of the backlog, so that jobs that
        # still cannot fit are not searched for again every cycle.
        self._engine = Engine(memo=BacklogMemo()) if incremental else None
        # Derived PodGroups found missing that wait for a cycle with no binds (_podgroups_to_create).
        self._deferred_groups: dict[tuple[str, str], GroupSpec] = {}
        # Lone pods' derived groups with no PodGroup made: one is made only
        # when the group has news (_podgroups_to_create); until the pod is
        # gone, the status writer writes nothing for it (see _after_binds).
        self._lone: dict[tuple[str, str], GroupSpec] = {}
        self._max_defer_s = bookkeeping_max_defer_s
        self._quiet_s = bookkeeping_quiet_s
        self._flushed_at = self._bound_at = time.monotonic()
        self._writers = writers
        # Sends a cycle's evictions while its binds onto free room go out (_execute); made when first needed.
        self._beside: ThreadPoolExecutor | None = None
        self._background = WriteBehind(self._after_binds) if writes_in_background else None
        # Derived PodGroups handed to the background writer and not yet created.
        self._queued: set[tuple[str, str]] = set()
        # Per queue, the GPU-seconds lost to faults last written (see lost_totals); written by one thread at a time.
        self._lost_written: dict[str, float] = {}
        self._reserved: dict[tuple[str, str], tuple[Reservation, ...]] = {}
        # Groups (namespace/name) whose PodGroup shows EvictionBlocked, kept like _reserved.
        self._shown_blocked: set[str] = set()
        # PodGroups whose status lists reservations, kept like _reserved, for the writer (None: not kept).
        self._listing: set[tuple[str, str]] = set()
        # What _job_facts keeps: the groups whose minMember runs (a dict for
        # its order), how each finished group ended, and the number of the
        # assembler's snapshot they reflect.
        self._gang_met: dict[str, None] = {}
        # Handed out as versions too, with the groups that entered or left
        # since the last version handed out (None: unknown, read whole), so
        # that the status writer looks at those and not at every running group.
        self._gang_met_versions: Versioned[str, None] | None = None
        self._gang_met_delta: set[str] | None = None
        self._gang_met_given: Frozen[str, None] | None = None  # the last version handed out
        self._ended: dict[str, Finished] = {}
        # The version handed out (None once changed): the status writer reads
        # it on its own thread, and copying every finished group of the
        # cluster's history whenever one more ended cost what history is.
        self._ended_out: Mapping[str, Finished] | None = None
        self._ended_versions: Versioned[str, Finished] | None = None
        # The groups whose end changed since that version (None: unknown, after a full read).
        self._ended_delta: set[str] | None = None
        # The last snapshot's nodes and their index by name (for the binds).
        self._nodes_by_name: tuple[tuple[Node, ...], dict[str, Node]] = ((), {})
        self._facts_serial: int | None = None
        self._problems_of: tuple[object, dict[str, tuple[str, str]]] | None = None
        # The Queue objects last parsed, and what _queues made of them.
        self._parsed_queues: tuple[dict[str, Mapping[str, Any]], tuple[list[Queue], dict[str, str]]] | None = None
        # The jobs of the last prepared view that have no pod left to run (_set_finished_apart).
        self._finished: tuple[Job, ...] = ()

    # -- inputs ---------------------------------------------------------------

    def _queues(self, view: ClusterView) -> tuple[list[Queue], dict[str, str]]:
        """The queues that parse, and for each Queue that does not, why (the engine and its status say so).

        Parsed again only when a Queue object changed: the same objects give
        the same answer, and parsing every Queue was a tenth of a lone
        arrival's time before its bind.
        """
        objects = view.queues
        last = self._parsed_queues
        if last is not None and len(last[0]) == len(objects) and all(objects.get(k) is v for k, v in last[0].items()):
            return last[1]
        parsed_now = self._parse_queues(objects)
        self._parsed_queues = (dict(objects), parsed_now)
        return parsed_now

    @staticmethod
    def _parse_queues(objects: Mapping[str, Mapping[str, Any]]) -> tuple[list[Queue], dict[str, str]]:
        queues: list[Queue] = []
        invalid: dict[str, str] = {}
        for name, obj in sorted(objects.items()):
            parsed = queue_from_object(obj)
            if isinstance(parsed, str):
                warn.warning("queue_invalid", ("queue", name, parsed), queue=name, problem=parsed)
                detail = parsed.removeprefix(f"queue {name}: ")
                invalid[name] = f"queue {name} is invalid: {detail}"
                continue
            queues.append(parsed)
        return queues, invalid

    def _queue_problems(self, snapshot: Snapshot) -> dict[str, tuple[str, str]]:
        """What each Queue's Invalid condition says: (reason, message) of those that cannot take work.

        Worked out again only when the queues changed (a handful of objects,
        but every cycle would redo it for nothing).
        """
        key = (snapshot.queues, snapshot.invalid_queues)
        if self._problems_of is not None and self._problems_of[0] == key:
            return self._problems_of[1]
        invalid = dict(snapshot.invalid_queues)
        problems = {name: (contract.QueueConditionReason.INVALID_SPEC.value, why) for name, why in invalid.items()}
        for name, why in build_tree(snapshot.queues, invalid).errors.items():
            if name not in invalid:
                problems[name] = (contract.QueueConditionReason.INVALID_TREE.value, why)
        self._problems_of = (key, problems)
        return problems

    def _take_token(self) -> None:
        """Wait for the bookkeeping pace (see ``_bucket``; slower while cycles bind), unless the cycle is closing."""
        if self._bucket is None or self._closing:
            return
        binding = time.monotonic() - self._bound_at < self._quiet_s
        bucket = self._busy_bucket if binding and self._busy_bucket is not None else self._bucket
        bucket.take()

    def _ensure_podgroup(self, spec: GroupSpec, paced: bool = False) -> None:
        """Create the PodGroup a derived group needs (once; it is owned by the workload)."""
        key = (spec.namespace, spec.name)
        if self.grouper.created(key):
            return
        if paced and self._pace is not None:
            self._pace()
        try:
            self._api.create_podgroup(spec.namespace, podgroup_object(spec))
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
        self.grouper.mark_created(key)

    def _follow_owners(self, drifted: Sequence[tuple[GroupSpec, Mapping[str, Any]]]) -> None:
        """Rewrite the spec of derived PodGroups whose owner changed (resized, relabelled): :mod:`.groups`.

        The write carries the resourceVersion it was decided from; a 409
        (someone wrote it since) is decided again next cycle.
        """
        for spec, obj in drifted:
            meta = _mapping(obj.get("metadata"))
            current = _mapping(obj.get("spec"))
            fields: JSON = dict(spec_fields(spec))
            if "priorityClassName" not in fields and current.get("priorityClassName"):
                fields["priorityClassName"] = None
            patch: JSON = {"spec": fields}
            version = meta.get("resourceVersion")
            if isinstance(version, str) and version:
                patch["metadata"] = {"resourceVersion": version}
            try:
                self._api.patch_podgroup(spec.namespace, spec.name, patch)
                log.info(
                    "podgroup_follows_owner",
                    podgroup=f"{spec.namespace}/{spec.name}",
                    min_member=spec.min_member,
                    queue=spec.queue,
                )
            except ApiError as exc:
                if exc.status not in (404, 409):
                    warn.warning(
                        "podgroup_update_failed",
                        ("podgroup-update", spec.namespace, spec.name),
                        podgroup=f"{spec.namespace}/{spec.name}",
                        status=exc.status,
                        error=exc.detail,
                    )

    def flush(self) -> None:
        """Wait until the writes of the cycles run so far are done (at once without ``writes_in_background``)."""
        if self._background is not None:
            self._background.flush()

    def close(self) -> None:
        """Finish the writes in flight, unpaced, and stop the background writer and the bind threads."""
        self._closing = True
        if self._background is not None:
            self._background.close()
        self.binder.close()
        self.reservations.close()
        beside, self._beside = self._beside, None
        if beside is not None:
            beside.shutdown(wait=True)

    def _podgroups_to_create(
        self,
        snapshot: Snapshot,
        view: ClusterView,
        decisions: Decisions,
        held: Sequence[Reservation],
        blocked: Mapping[str, str],
    ) -> tuple[list[GroupSpec], bool]:
        """The derived PodGroups to create after this cycle's binds; decides whether bookkeeping waits.

        A PodGroup made for a group that is placed in full, and its first
        Running status, say nothing its pods do not: while cycles are
        binding they wait, so that they do not take the API server from the
        binds of pods still arriving, and are written once no cycle has
        bound anything for ``bookkeeping_quiet_s``, or
        ``bookkeeping_max_defer_s`` after they were last written, whichever
        comes first. The second value says whether they wait now (the
        status writer's ``defer_placed``). A group that waits, has room
        reserved or an eviction refused is news: its PodGroup is created at
        once.

        A lone pod's group (:attr:`~.grouping.GroupSpec.lone`: a bare pod, a
        Deployment's replica) gets no PodGroup until it has news, and none
        at all when it never has: placed at once, it runs and ends as its
        pod shows, and its PodGroup, Running status and final status were
        three writes per pod that the API server took from the binds of the
        pods arriving next (under single-pod churn three times as many
        writes as binds, and the binds' p99 half as long again as with
        none, ``benchmarks/scheduler_soak.py --mode contender``).
        """
        for key, spec in self.grouper.take_missing().items():
            if not spec.lone or key in self._deferred_groups:
                self._deferred_groups.setdefault(key, spec)
            elif not (key in self._queued or self.grouper.created(key) or key in view.podgroups):
                # Found missing again at each change of its pod; one that had
                # news (on its way to be made, or made) is never parked again.
                self._lone[key] = spec
        now = time.monotonic()
        if decisions.binds:
            self._bound_at = now
        busy = now - self._bound_at < self._quiet_s and now - self._flushed_at < self._max_defer_s
        if not busy:
            self._flushed_at = now
        urgent = {p.job for p in decisions.pending} | {r.job for r in held} | set(blocked)
        if self._lone and urgent:
            for key in (_group_key(job) for job in urgent):
                if key in self._lone:
                    self._deferred_groups[key] = self._lone.pop(key)  # news: made below, at once
        specs: list[GroupSpec] = []
        if not self._deferred_groups:
            return specs, busy  # the common cycle: no set of every job's key to build
        # While busy only news goes out, so only the urgent groups are looked
        # at: the rest (hundreds, under steady arrivals) wait for the flush,
        # which also drops those created or gone meanwhile.
        looked_at: Collection[tuple[str, str]] = self._deferred_groups
        if busy:
            looked_at = [k for k in (_group_key(job) for job in urgent) if k in self._deferred_groups]
        # Whether the group is still a job: the assembler knows at once; the
        # full-rebuild path collects every job's key.
        keys = None if self._incremental else {job.key for job in itertools.chain(snapshot.jobs, self._finished)}

        def present(key: tuple[str, str]) -> bool:
            return self._snapshots.has_job(key) if keys is None else f"{key[0]}/{key[1]}" in keys

        for key in list(looked_at):
            group = f"{key[0]}/{key[1]}"
            if self.grouper.created(key) or key in view.podgroups or not present(key):
                del self._deferred_groups[key]
            elif key in self._queued or (busy and group not in urgent):
                continue
            else:
                specs.append(self._deferred_groups.pop(key))
        return specs, busy

    def _execute(self, decisions: Decisions, nodes: Mapping[str, Node]) -> _Executed:
        """The cycle's evictions and binds: what was attempted of each, binds in the decisions' order, and those sent.

        With ``binds_in_background`` the binds onto free room are sent and
        not waited for (:mod:`.inflight`); the first one's request is written
        from this thread, because waking a pool thread put a millisecond or
        two (on two busy cores) between a lone arrival and its bind.
        """
        binds: Sequence[Bind] = decisions.binds
        later: tuple[Bind, ...] = ()
        sending: tuple[Future[BindResult], ...] = ()
        if self.inflight is not None:
            later = tuple([bind for bind in binds if not bind.pipelined])
            if later:
                sending = self.inflight.send(later, nodes)
                left = {id(bind) for bind in later}
                binds = [bind for bind in binds if id(bind) not in left]
        attempted, bound = self._evict_and_bind(decisions.evictions, binds, nodes)
        return _Executed(attempted, bound, later, sending)

    def _evict_and_bind(
        self, evictions: Sequence[Eviction], binds: Sequence[Bind], nodes: Mapping[str, Node]
    ) -> tuple[list[EvictResult], list[BindResult]]:
        """Evictions and the binds waited for: what was attempted of each, binds in their order.

        Evictions beyond the rate wait for a later cycle instead of holding
        up this one's binds (``wait=False``). A pipelined bind goes out only
        after the evictions (it waits for its node's victims, see
        :mod:`.bind`); every other bind takes room that is free already and
        goes out beside them: under a deep backlog the evictions' round
        trips were a fifth of the cycle, with the binds waiting behind them.
        """
        if not evictions:
            return [], self.binder.bind_all(binds, nodes) if binds else []
        free = [bind for bind in binds if not bind.pipelined]
        if not free:
            attempted = self.evictor.evict_all(evictions, wait=False)
            return attempted, self.binder.bind_all(binds, nodes, evictions=evictions) if binds else []
        if self._beside is None:
            self._beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evictions")
        evicting = self._beside.submit(self.evictor.evict_all, evictions, wait=False)
        try:
            early = self.binder.bind_all(free, nodes)
        except BaseException:
            wait([evicting])  # none of the cycle's writes may still be going out behind the caller
            raise
        attempted = evicting.result()
        piped = [bind for bind in binds if bind.pipelined]
        late = self.binder.bind_all(piped, nodes, evictions=evictions) if piped else []
        by_bind = {id(result.bind): result for result in itertools.chain(early, late)}
        return attempted, [by_bind[id(bind)] for bind in binds]

    def _explain_refused(self, snapshot: Snapshot, pending: Sequence[JobStatus]) -> None:
        """An Event on each slice pod refused for lacking what the webhook injects (its group has the condition)."""
        refused = {p.job for p in pending if any(r.code is _SLICE_NOT_ADMITTED for r in p.reasons)}
        tasks = [t for job in snapshot.jobs if job.key in refused for t in job.tasks] if refused else []
        self.refusals.explain(tasks)

    def _after_binds(self, batch: WriteBatch) -> None:
        """A cycle's bookkeeping (or several cycles', merged): creates, owners read again, statuses."""
        specs = list(batch.specs.values())
        try:
            try:
                self._create_podgroups(specs, paced=True)
            finally:
                # Created, or to be tried again by the next cycle that finds it missing.
                self._queued.difference_update(batch.specs)
            self._follow_owners(list(batch.drifted.values()))
            self.status.forget_gone(batch.podgroups, batch.podgroups_changed)
        except BaseException:
            # The status writer never saw this batch's finished changes; the
            # next batch names only its own, so the writer must look at
            # every finished group once.
            self.status.forget_finished()
            raise
        totals = lost_totals(batch.queues, batch.lost, self._lost_written)
        # Only queues that still exist keep a total (one deleted and made
        # again starts from what its new object shows).
        self._lost_written = totals

        def unmirrored(group: str) -> bool:
            """A lone pod's group with no PodGroup: nothing to write while it has no news."""
            # Read on the writer's thread: one lookup in the cycle's current dict.
            key = _group_key(group)
            return key in self._lone and key not in batch.podgroups

        self.status.write(
            batch.decisions,
            gang_met=batch.gang_met,
            gang_met_changed=batch.gang_met_changed,
            blocked=batch.blocked,
            shown_blocked=batch.shown_blocked,
            lost_totals=totals,
            queue_problems=batch.queue_problems,
            defer_placed=batch.defer_placed,
            finished=batch.finished,
            finished_changed=batch.finished_changed,
            podgroups=batch.podgroups,
            unmirrored=unmirrored,
        )

    def _create_podgroups(self, specs: list[GroupSpec], paced: bool = False) -> None:
        """Create the derived PodGroups found missing, from a pool of threads (each create is one round trip).

        ``paced``: behind the cycles, at the bookkeeping rate; never on the
        cycle's own thread, which must not wait for tokens.
        """
        if len(specs) <= 1:
            for spec in specs:
                self._ensure_podgroup(spec, paced)
            return
        with ThreadPoolExecutor(max_workers=min(self._writers, len(specs)), thread_name_prefix="podgroup") as pool:
            list(pool.map(lambda spec: self._ensure_podgroup(spec, paced), specs))

    def _reservations(self, view: ClusterView, *, full: bool) -> tuple[Reservation, ...]:
        """The view's reservations under the writer's unseen writes; unless ``full``, only changed groups read again."""
        keys: Collection[tuple[str, str]]
        if full or view.changed is None:
            self._reserved.clear()
            self._shown_blocked.clear()
            self._listing.clear()
            keys = list(view.podgroups)
        else:
            keys = view.changed.podgroups
        for key in keys:
            group = view.podgroups.get(key)
            found = reservations_of(key, group) if group is not None else ()
            if found:
                self._reserved[key] = found
            else:
                self._reserved.pop(key, None)
            # Read off the same changed PodGroups: which show EvictionBlocked now.
            name = f"{key[0]}/{key[1]}"
            if group is not None and shows_blocked(group):
                self._shown_blocked.add(name)
            else:
                self._shown_blocked.discard(name)
            if group is not None and lists_reservations(group):
                self._listing.add(key)
            else:
                self._listing.discard(key)
        return self.reservations.overlay(self._reserved, view.podgroups)

    def _job_facts(
        self, snapshot: Snapshot
    ) -> tuple[Frozen[str, None], MembershipChange | None, Mapping[str, Finished], frozenset[str] | None]:
        """The groups whose minMember runs and which of them changed; how each finished group ended, and which changed.

        Kept from cycle to cycle and read again only for the jobs the
        assembler changed (:class:`~.assemble.JobChanges`): a cycle costs
        what changed, not a walk over every job, finished ones included.
        Without the assembler's changes (the full-rebuild path, a cycle
        that missed some) every job is read. The second value names the
        groups that started or stopped running at their minMember since the
        version last handed out, the fourth those whose end changed since
        the mapping last handed out (None: unknown, every one may have), so
        that the status writer looks at those and not at every running
        group, nor at every finished group of the cluster's history.
        """
        changes = self._snapshots.job_changes if self._incremental else None
        changed = changes.after(self._facts_serial) if changes is not None else None
        self._facts_serial = None  # until the facts are complete
        if changed is None:
            self._gang_met.clear()
            self._gang_met_delta = None
            self._ended.clear()
            self._ended_out = None
            self._ended_delta = None
            finished = self._snapshots.finished_jobs.values() if self._incremental else self._finished
            present: set[tuple[str, str]] = set()
            for job in itertools.chain(snapshot.jobs, finished):
                self._read_facts(job.key, job)
                present.add(_group_key(job.key))
            self._lone = {key: spec for key, spec in self._lone.items() if key in present}
        else:
            for key, now in changed.items():
                self._read_facts(key, now)
        if changes is not None:
            self._facts_serial = changes.serial
        delta: frozenset[str] | None = frozenset()
        if self._ended_out is None:
            # A new mapping only when something ended or un-ended: the same
            # one otherwise, which tells the status writer so (it reads the
            # mapping on its own thread, so this one is never changed).
            versions = self._ended_versions
            if versions is None or self._ended_delta is None:
                versions = self._ended_versions = Versioned(self._ended)
            else:
                versions.changed(self._ended_delta)
            self._ended_out = versions.freeze()
            delta = frozenset(self._ended_delta) if self._ended_delta is not None else None
            self._ended_delta = set()
        return (*self._gang_met_version(), self._ended_out, delta)

    def _gang_met_version(self) -> tuple[Frozen[str, None], MembershipChange | None]:
        """The groups whose minMember runs, as a version, and what changed since the version handed out before."""
        given, delta = self._gang_met_given, self._gang_met_delta
        if given is not None and delta is not None and not delta:
            return given, MembershipChange(given, frozenset())  # the same version: nothing changed since it
        self._gang_met_delta = set()
        versions = self._gang_met_versions
        change: MembershipChange | None = None
        if versions is None or given is None or delta is None:
            versions = self._gang_met_versions = Versioned(self._gang_met)  # read whole: no change to name
        else:
            versions.changed(delta)
            change = MembershipChange(given, frozenset(delta))
        out = self._gang_met_given = versions.freeze()
        return out, change

    def _gang_met_changed(self, key: str) -> None:
        """``key`` entered or left the groups whose minMember runs."""
        if self._gang_met_delta is not None:
            self._gang_met_delta.add(key)

    def _read_facts(self, key: str, job: Job | None) -> None:
        """Whether ``job``'s minMember runs and how it ended, into the kept facts (None: it is gone).

        A finished job is never counted as running at its minMember: how it
        ended is its status, and a group named there would never count as
        settled for the status writer, which would then compare every
        finished group's status every cycle.
        """
        running = sum(1 for t in job.tasks if t.status is TaskStatus.RUNNING) if job is not None else 0
        if job is not None and job.tasks and running + job.succeeded >= job.min_member:
            if key not in self._gang_met:
                self._gang_met[key] = None
                self._gang_met_changed(key)
        elif key in self._gang_met:
            del self._gang_met[key]
            self._gang_met_changed(key)
        if job is None and self._lone:
            self._lone.pop(_group_key(key), None)  # its pod is gone: it will never need a PodGroup
        ended = finished_phase(job) if job is not None else None
        if self._ended.get(key) != ended:
            self._ended_out = None
            if self._ended_delta is not None:
                self._ended_delta.add(key)
            if ended is not None:
                self._ended[key] = ended
            else:
                del self._ended[key]

    # -- the cycle --------------------------------------------------------------

    def prepare(self, view: ClusterView, now: float) -> Snapshot:
        """The engine's input for ``view``: pods grouped, objects converted, gangs dated, reservations read.

        This is the part of a cycle that reads every object; it makes no API
        call unless a pod needs a derived PodGroup created or its owners read.
        """
        queues, invalid = self._queues(view)
        if self._incremental:
            changes = self.grouper.regroup(view)
            if changes is not None:
                assert view.changed is not None
                changes = replace(changes, nodes=view.changed.nodes | view.changed.gpunodes)
            try:
                snapshot = self._snapshots.snapshot(
                    view.nodes,
                    view.gpunodes,
                    view.pods,
                    queues,
                    self.grouper.groups,
                    now,
                    self._config,
                    pod_groups=self.grouper.by_uid,
                    changes=changes,
                    finished_apart=True,
                )
                reservations = self._reservations(view, full=changes is None)
            except BaseException:
                self.grouper.invalidate()  # the kept state may be half updated: start over next cycle
                raise
        else:
            self.grouper.group_all(view)
            snapshot = snapshot_from(
                view.nodes,
                view.gpunodes,
                view.pods.values(),
                queues,
                self.grouper.groups,
                now,
                self._config,
                pod_groups=self.grouper.by_uid,
                admission=self._admission,
            )
            reservations = self.reservations.overlay(reservations_by_group(view.podgroups), view.podgroups)
            snapshot = self._set_finished_apart(snapshot)
        # Dated first, on the assembler's own jobs: the passes after it
        # replace tasks and keep the date (see JobChanges).
        jobs_changed = self._snapshots.job_changes if self._incremental else None
        snapshot = self._short_gangs.date(snapshot, now, jobs_changed)
        snapshot = self._volumes.apply(snapshot, view.claims, view.volumes, jobs_changed)
        snapshot = self.claims.apply(
            snapshot,
            DraObjects(
                pods=view.pods,
                claims=view.resource_claims,
                classes=view.device_classes,
                slices=view.resource_slices,
                rules=view.device_taint_rules,
                nodes=view.nodes,
                claims_readable=RESOURCECLAIMS not in view.missing,
            ),
        )
        snapshot = self.backoff.apply(snapshot, now)
        return replace(snapshot, reservations=reservations, invalid_queues=tuple(sorted(invalid.items())))

    def _claim_plans(self) -> Mapping[str, ClaimPlan]:
        return self.claims.plans

    def _set_finished_apart(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` without the jobs none of whose pods is left to run; they are kept in ``_finished``.

        A finished job (every pod Succeeded or Failed) only waits for its
        PodGroup's final status; nothing of the engine's or of the passes
        before it applies. Finished pods of Jobs stay in the cluster until
        someone deletes them, so in a busy cluster they soon outnumber the
        jobs that run: left in, they made every per-job pass of every
        cycle, the engine's among them, grow with the cluster's history.
        The full-rebuild path sets them apart here; the incremental one has
        the assembler keep them apart (``finished_apart``).
        """
        if all(job.tasks for job in snapshot.jobs):
            self._finished = ()
            return snapshot
        self._finished = tuple(job for job in snapshot.jobs if not job.tasks)
        return replace(snapshot, jobs=tuple(job for job in snapshot.jobs if job.tasks))

    def _tell_ungrouped(self, view: ClusterView) -> None:
        """Explain the pods that wait for their named PodGroup; before the binds (see :mod:`.ungrouped`)."""
        ungrouped = self.grouper.ungrouped(view)
        if not ungrouped and not self.ungrouped.told:
            return

        def still_pending(uid: str) -> bool:
            pod = view.pods.get(uid)
            return pod is not None and waiting(pod)

        self.ungrouped.write(ungrouped, still_pending)

    def decide(self, snapshot: Snapshot, timings: dict[str, float] | None = None) -> Decisions:
        """The engine's session over ``snapshot`` (on the kept working state when incremental)."""
        if self._engine is None:
            return run_session(snapshot, timings)
        return self._engine.run(snapshot, timings)

    def run(self, view: ClusterView) -> CycleResult:
        """One cycle over ``view``, with Python's cyclic collector paused until it ends.

        A collection runs wherever the allocations that trigger it happen:
        in a cycle, between a pod's placement and its bind, and the pod
        waited for it (a young collection took 25 ms in the single-pod soak,
        once a minute, every time inside a cycle). The engine's session
        already paused it; paused for the whole cycle, it runs once the
        cycle's binds are out. In the scheduler process the loop has taken
        collection over once its cache synced (:mod:`scheduler.collector`),
        and this pauses nothing.
        """
        with collector_paused():
            return self._run(view)

    def _run(self, view: ClusterView) -> CycleResult:
        clock = time.monotonic
        started = clock()
        # Binds of earlier cycles answered since (raises if one met the fence).
        answered = self.inflight.answered() if self.inflight is not None else []
        now = self._clock()
        snapshot = self.prepare(view, now)
        prepared = clock()
        timings: dict[str, float] = {}
        decisions = self.decide(snapshot, timings)
        decided = clock()
        self._tell_ungrouped(view)
        if snapshot.nodes is not self._nodes_by_name[0]:  # the same tuple while no node changed
            self._nodes_by_name = (snapshot.nodes, {n.name: n for n in snapshot.nodes})
        nodes = self._nodes_by_name[1]
        done = self._execute(decisions, nodes)
        attempted, bound, sent = done.attempted, done.bound, done.sent
        executed = clock()
        evicted = [r for r in attempted if r.outcome is not EvictOutcome.DEFERRED]
        lost = gpu_seconds_lost(evicted, snapshot, view.pods, now)
        misplaced = tuple(misplaced_evictions(evicted, snapshot, decisions.reservations)) if evicted else ()
        if misplaced:
            misplaced = tuple(self.backoff.record(misplaced, now))
            self.misplaced.write(misplaced)
        # Room a bind has just taken needs holding no longer; a deferred or
        # failed pipelined bind keeps its reservation for the next cycle.
        # A bind sent in the background counts as taken: if it fails, the
        # next cycles place the pod again (see :mod:`.inflight`).
        taken = {(r.bind.job, r.bind.node, r.bind.gpu_indices) for r in bound if r.ok}
        taken.update((b.job, b.node, b.gpu_indices) for b in sent)
        held = tuple(r for r in decisions.reservations if (r.job, r.node, r.gpu_indices) not in taken)
        unsent = [r.eviction for r in attempted if r.outcome is EvictOutcome.DEFERRED]
        if unsent:
            held = _freed_only(held, unsent)
        gang_met, gang_met_changed, finished, finished_changed = self._job_facts(snapshot)
        shares = tuple(s for s in decisions.queue_shares if not is_external_queue(s.queue))
        pending = tuple(p for p in decisions.pending if not is_external_queue(p.queue))
        self._explain_refused(snapshot, pending)
        written = replace(decisions, queue_shares=shares, pending=pending)
        blocked = refusals(evicted)
        specs, defer_placed = self._podgroups_to_create(snapshot, view, decisions, held, blocked)
        # Reservations live in PodGroup status: a derived group that holds
        # one needs its PodGroup before they are written, not after.
        reserving = {r.job for r in held}
        first = [spec for spec in specs if f"{spec.namespace}/{spec.name}" in reserving]
        if first:
            self._create_podgroups(first)
            specs = [spec for spec in specs if f"{spec.namespace}/{spec.name}" not in reserving]
        self.reservations.write(held, view.podgroups, self._listing if self._incremental else None)
        batch = WriteBatch(
            specs={(s.namespace, s.name): s for s in specs},
            drifted={(spec.namespace, spec.name): (spec, owner) for spec, owner in self.grouper.drifted(view)},
            decisions=written,
            gang_met=gang_met,
            gang_met_changed=gang_met_changed,
            finished=finished,
            finished_changed=finished_changed,
            blocked=blocked,
            shown_blocked=frozenset(self._shown_blocked),
            lost=lost,
            queues=view.queues,
            queue_problems=self._queue_problems(snapshot),
            defer_placed=defer_placed,
            podgroups=view.podgroups,
            podgroups_changed=view.changed.podgroups if view.changed is not None else None,
            after=done.sending,
        )
        if self._background is None:
            self._after_binds(batch)
        else:
            self._queued.update(batch.specs)
            self._background.submit(batch)
        finished_at = clock()
        seconds = finished_at - started
        stages = {
            "prepare": prepared - started,
            "engine": decided - prepared,
            "execute": executed - decided,
            "bookkeeping": finished_at - executed,
        }
        log.info(
            "cycle_done",
            binds=sum(1 for r in bound if r.ok),
            binds_sent=len(sent),  # answered to a later cycle
            bind_failures=sum(1 for r in itertools.chain(answered, bound) if not r.ok),
            evictions=len(evicted),
            reservations=len(held),
            pending=len(pending),
            seconds=round(seconds, 4),
            # Where a slow cycle spent its time, without a profiler.
            **{f"{stage}_ms": round(1000 * took, 2) for stage, took in stages.items()},
        )
        memo = self._engine.memo if self._engine is not None else None
        return CycleResult(
            snapshot,
            decisions,
            (*answered, *bound),
            tuple(evicted),
            seconds,
            timings,
            held,
            lost,
            misplaced,
            stages,
            memo.counts if memo is not None else None,
            sent,
            nodes,
        )
