"""The session's mutable working state, built once from the Snapshot.

The Snapshot is immutable; a session needs to simulate "what if this pod ran
there, and that one were gone". This module holds that simulation: per node
the free CPU, memory and per-GPU memory bins; per queue what it holds; per
pod where it currently sits. Two primitives change it, :meth:`Cluster.take`
and :meth:`Cluster.release`, and they are exact inverses, so a statement can
undo a plan by replaying its log backwards instead of copying the cluster.

Indexes kept up to date by those two primitives, so that placement does not
scan every node for every pod:

- per pool and health tier, nodes bucketed by their count of free whole GPUs;
- per pool and health tier, nodes with partly used (sliced) GPUs bucketed by
  the largest free memory on such a GPU;
- per pool, the total of free whole GPUs (a gang that needs more is refused
  without looking at a node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpuwarden.contract import EvictionAction
from scheduler.engine.fairshare import TreeQueue
from scheduler.engine.model import Job, Node, PendingReason, PlacementStrategy, Reservation, Task
from scheduler.engine.podindex import PodIndex
from scheduler.engine.resources import CPU, GPU, MEMORY, MILLI, RESOURCES, GpuRequest


class EvictionRecord(NamedTuple):
    """Why a pod is evicted: the action, its reason, and the job it makes room for."""

    action: EvictionAction
    reason: str
    beneficiary: str | None


# Health tiers: healthy nodes are tried before degraded ones.
TIER_HEALTHY = 0
TIER_DEGRADED = 1
TIERS = (TIER_HEALTHY, TIER_DEGRADED)


@dataclass(slots=True, eq=False)
class NodeState:
    spec: Node
    pool: PoolState
    pidx: int  # index within its pool
    free_cpu: int
    free_mem: int
    gpu_index: list[int]  # device index per position
    gpu_mem: list[int]  # MiB per position
    gpu_free: list[int]  # free MiB per position
    gpu_whole: list[int]  # whole-GPU holders per position (more than 1 only in bad snapshots)
    gpu_slices: list[int]  # slice holders per position
    gpu_ok: list[bool]  # usable: healthy, not faulted, not in MIG mode
    gpu_bad_reason: list[str | None]
    free_whole: int  # usable positions held by nobody
    dense: bool  # GPU indices are 0..n-1, so an index is its own position
    mig: bool
    accepts: bool  # takes new pods at all
    excluded: str | None  # why it takes none (for explanations)
    node_fatal: str | None
    degraded: tuple[str, ...]
    tier: int
    tasks: list[TaskState] = field(default_factory=list)
    # A GPU out of service that the device plugin still offers: the kubelet
    # may hand it to a whole-GPU pod (scheduler.engine.scoring keeps a free
    # healthy GPU on such a node where it can).
    trap: bool = False
    evicted_here: bool = False
    bucket: int | None = None  # key in pool.whole_buckets[tier], when accepting
    shared_key: int | None = None  # key in pool.shared_buckets[tier]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_sick(self) -> bool:
        """A fatal fault or a GPU out of service: health eviction has work here (fixed for the state's life)."""
        return self.node_fatal is not None or any(self.gpu_bad_reason)

    def position(self, gpu_index: int) -> int | None:
        try:
            return self.gpu_index.index(gpu_index)
        except ValueError:
            return None


@dataclass(slots=True, eq=False)
class PoolState:
    name: str
    strategy: PlacementStrategy
    nodes: list[NodeState] = field(default_factory=list)
    capacity: list[int] = field(default_factory=lambda: [0, 0, 0])
    reference_gpu_mem: int = 0  # largest GPU memory in the pool
    min_gpu_mem: int = 0
    max_gpus: int = 0
    granule: int = 1024  # MiB per shared bucket
    free_whole_total: int = 0
    # Bumped by every release of room on its nodes except a rollback undoing
    # its own statement's placements: a remembered "no room" stands while it
    # is unchanged (scheduler.engine.backlog).
    growth: int = 0
    whole_buckets: tuple[dict[int, dict[int, NodeState]], ...] = field(default_factory=lambda: ({}, {}))
    shared_buckets: tuple[dict[int, dict[int, NodeState]], ...] = field(default_factory=lambda: ({}, {}))
    # What the pool would offer with all its hardware in service
    # (scheduler.engine.decisions), summed once: a kept state's pool keeps
    # its nodes from session to session. None until summed, and again
    # whenever a node of the pool is replaced.
    intact: list[int] | None = None


@dataclass(slots=True, eq=False)
class QueueState:
    tree: TreeQueue
    pool: str
    parent: QueueState | None
    quota: list[int]
    limit: list[int]
    path: list[QueueState] = field(default_factory=list)  # top-level .. self
    # Per resource, whether the queue may hold more than its quota: not where
    # its overQuotaWeight is 0 ("never borrows", even from an idle cluster).
    borrows: tuple[bool, bool, bool] = (True, True, True)
    alloc: list[int] = field(default_factory=lambda: [0, 0, 0])
    np_alloc: list[int] = field(default_factory=lambda: [0, 0, 0])
    share: list[int] = field(default_factory=lambda: [0, 0, 0])
    request: list[int] = field(default_factory=lambda: [0, 0, 0])
    jobs: list[JobState] = field(default_factory=list)
    # The sum of ``jobs``' demand, kept as jobs are added and removed, so
    # that fair share is worked out from the queues, not from every job.
    demand: list[int] = field(default_factory=lambda: [0, 0, 0])

    @property
    def name(self) -> str:
        return self.tree.name

    def share_ratio(self) -> float:
        """Largest allocated/fair-share ratio over the resources the queue asks
        for or holds: below 1 is "below fair share".

        A queue with no share of a resource it needs is never below its fair
        share: it deserves none of that resource right now.
        """
        worst = 0.0
        for r in RESOURCES:
            a = self.alloc[r]
            if a <= 0 and self.request[r] <= 0:
                continue
            s = self.share[r]
            if s <= 0:
                return float("inf")
            worst = max(worst, a / s)
        return worst


@dataclass(slots=True, eq=False)
class TaskState:
    spec: Task
    job: JobState
    gpu: GpuRequest
    cpu: int
    mem: int
    milli: int  # milli-GPUs charged to the queue
    was_running: bool  # held resources in the snapshot
    releasing: bool
    node: NodeState | None = None
    gpu_pos: tuple[int, ...] = ()
    slices: tuple[int, ...] = ()  # MiB per position, for slice holders
    eviction: EvictionRecord | None = None
    shape: tuple[object, ...] = ()
    # A stand-in holding a job's reserved room (scheduler.engine.reservations):
    # it holds resources like a running pod but is no pod, never a victim.
    placeholder: bool = False
    # Its place in job.tasks: with the job's key, the order the build seats
    # a node's holders in (scheduler.engine.incremental restores it).
    rank: int = 0

    @property
    def is_pending(self) -> bool:
        """Still waiting for a place (never ran, not placed this session)."""
        return not self.was_running and self.node is None


@dataclass(slots=True, eq=False)
class HeldRoom:
    """One reservation of a job in this session.

    ``placeholder`` holds the room on ``node`` while it is free and unused;
    None while terminating pods still hold it (``awaiting``). A placeholder
    released by the job's own placement was used.
    """

    reservation: Reservation
    node: NodeState
    placeholder: TaskState | None = None
    awaiting: bool = False

    @property
    def kept(self) -> bool:
        """Still to be held after the session: unused, or still being freed."""
        seated = self.placeholder is not None and self.placeholder.node is not None
        return seated or self.awaiting


@dataclass(slots=True, eq=False)
class JobState:
    spec: Job
    key: str
    queue: QueueState | None
    pool: PoolState | None
    preemptible: bool
    tasks: list[TaskState] = field(default_factory=list)
    error: PendingReason | None = None
    reasons: list[PendingReason] = field(default_factory=list)
    unplaced: TaskState | None = None  # the task that found no node, for explanations
    notes: list[str] = field(default_factory=list)  # what reclaim/preempt tried, for explanations
    reserved: list[HeldRoom] = field(default_factory=list)  # the job's reservations this session
    # Room reserved for the job is still held by terminating pods: no action
    # evicts more on its behalf while the last eviction is finishing.
    awaiting_room: bool = False
    # Set by the build: GPU (milli), CPU (milli) and memory (MiB) all its
    # pods ask for, and whether one of them has never run.
    demand: tuple[int, int, int] = (0, 0, 0)
    has_pending: bool = False

    @property
    def held(self) -> int:
        """Tasks holding resources now (running, or placed this session)."""
        return sum(1 for t in self.tasks if t.node is not None and not t.releasing)

    @property
    def satisfied(self) -> int:
        """Members that count toward the gang: those held, and those that finished successfully."""
        return self.held + self.spec.succeeded

    @property
    def gang_short(self) -> int:
        """How many more members must be placed before the gang is whole (0 once it is)."""
        return max(0, self.spec.min_member - self.satisfied)

    def pending_tasks(self) -> list[TaskState]:
        return [t for t in self.tasks if t.is_pending]

    def needs_gang(self) -> bool:
        """True while the job has pending tasks and its gang is not whole yet."""
        return self.gang_short > 0 and any(t.is_pending for t in self.tasks)


@dataclass(slots=True, eq=False)
class Cluster:
    """All working state of one session, plus the counters actions consult.

    What placement, the victim search and the explanations cache about this
    state lives in :class:`scheduler.engine.caches.SessionCaches`, owned by
    the session, so this module depends on none of them.
    """

    pools: dict[str, PoolState]
    nodes: dict[str, NodeState]
    queues: dict[str, QueueState]
    jobs: list[JobState]
    now: float
    stale_gang_grace_s: float
    reservation_ttl_s: float = 300.0
    # Bumped whenever resources are released: a cached "nothing fits" is
    # only trusted while it is unchanged.
    release_version: int = 0
    # Bumped on every committed statement.
    commit_version: int = 0
    touched: list[TaskState] = field(default_factory=list)
    indexed: bool = False
    # Jobs with at least one pod that has never run (allocate's work list).
    pending_jobs: list[JobState] = field(default_factory=list)
    # Jobs whose gang was dated short (``below_min_member_since``): what
    # the stale-gang action looks at, instead of every job.
    dated_gangs: list[JobState] = field(default_factory=list)
    # Jobs that had reservations seated this session, in seating order.
    reserving: list[JobState] = field(default_factory=list)
    # Nodes with a fatal fault or a GPU out of service, in the order of
    # ``nodes``: what health eviction looks at, instead of every node.
    sick: list[NodeState] = field(default_factory=list)
    # Kept only while the state outlives its session
    # (scheduler.engine.incremental): every committed statement's undo log,
    # how many entries statements applied and did not roll back (equal to
    # the journal's length unless a statement was left open), and the nodes
    # whose holders changed, whose order in their lists must be made
    # canonical again before the next session.
    journal: list[Any] | None = None
    applied: int = 0
    dirty: set[NodeState] | None = None
    # Placement rules (scheduler.engine.rules): pods of the snapshot with
    # a required anti-affinity (kept by the job builder as jobs come and
    # go), which make every pod's placement consult the bound pods; the
    # bystanders of the snapshot; and the session's index of bound pods,
    # built on first use and dropped when the session ends.
    anti_holders: int = 0
    bystanders: tuple[Task, ...] = ()
    bystander_anti: bool = False
    pod_index: PodIndex | None = None

    def find_sick(self) -> None:
        """Set :attr:`sick` from every node (after a build, or once a node changed its health)."""
        self.sick = [node for node in self.nodes.values() if node.is_sick]

    def set_bystanders(self, tasks: tuple[Task, ...]) -> None:
        """The snapshot's pods on nodes that take no work of ours (see :class:`Snapshot`)."""
        self.bystanders = tasks
        self.bystander_anti = any(t.placement is not None and t.placement.anti_affinity for t in tasks)

    # ------------------------------------------------------------------
    # The two primitives
    # ------------------------------------------------------------------

    def take(self, task: TaskState, node: NodeState, positions: tuple[int, ...], slices: tuple[int, ...]) -> None:
        """Make ``task`` hold its request on ``node`` (GPU ``positions``)."""
        if self.dirty is not None:
            self.dirty.add(node)
        before = node.free_whole
        self.seat(task, node, positions, slices)
        self._charge(task, 1)
        if self.pod_index is not None and not task.placeholder:
            self.pod_index.add(id(task), task.spec, node.spec)
        if positions and self.indexed:
            self._reindex(node, before)

    @staticmethod
    def seat(task: TaskState, node: NodeState, positions: tuple[int, ...], slices: tuple[int, ...]) -> None:
        """The node half of :meth:`take` (no queue charge, no index update).

        Building the state seats every running pod this way and charges
        queues once per job, which is most of what makes a 150,000-pod
        snapshot cheap to load.
        """
        node.free_cpu -= task.cpu
        node.free_mem -= task.mem
        if slices:
            for p, s in zip(positions, slices, strict=True):
                if node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]:
                    node.free_whole -= 1
                node.gpu_slices[p] += 1
                node.gpu_free[p] -= s
        else:
            for p in positions:
                if node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]:
                    node.free_whole -= 1
                node.gpu_whole[p] += 1
        node.tasks.append(task)
        task.node = node
        task.gpu_pos = positions
        task.slices = slices

    @staticmethod
    def charge(queue: QueueState, preemptible: bool, gpu: int, cpu: int, mem: int) -> None:
        """Add an amount to a queue and its ancestors (negative to remove)."""
        for q in queue.path:
            a = q.alloc
            a[GPU] += gpu
            a[CPU] += cpu
            a[MEMORY] += mem
            if not preemptible:
                n = q.np_alloc
                n[GPU] += gpu
                n[CPU] += cpu
                n[MEMORY] += mem

    def release(self, task: TaskState, *, undo: bool = False) -> None:
        """Undo :meth:`take`: ``task`` no longer holds anything.

        ``undo``: a rollback takes back a placement of its own statement,
        which leaves no more room than there was when the statement began.
        """
        node = task.node
        assert node is not None
        if not undo:
            node.pool.growth += 1
        if self.dirty is not None:
            self.dirty.add(node)
        node.free_cpu += task.cpu
        node.free_mem += task.mem
        before = node.free_whole
        if task.slices:
            for p, s in zip(task.gpu_pos, task.slices, strict=True):
                node.gpu_slices[p] -= 1
                node.gpu_free[p] += s
                if node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]:
                    node.free_whole += 1
        else:
            for p in task.gpu_pos:
                node.gpu_whole[p] -= 1
                if node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]:
                    node.free_whole += 1
        node.tasks.remove(task)
        positions = task.gpu_pos
        task.node = None
        task.gpu_pos = ()
        task.slices = ()
        self._charge(task, -1)
        self.release_version += 1
        if self.pod_index is not None:
            self.pod_index.remove(id(task))
        if positions and self.indexed:
            self._reindex(node, before)

    def _charge(self, task: TaskState, sign: int) -> None:
        queue = task.job.queue
        if queue is not None:
            self.charge(queue, task.job.preemptible, task.milli * sign, task.cpu * sign, task.mem * sign)

    def _reindex(self, node: NodeState, free_before: int) -> None:
        if not node.accepts:
            return
        pool = node.pool
        if node.free_whole != free_before:
            pool.free_whole_total += node.free_whole - free_before
            buckets = pool.whole_buckets[node.tier]
            if node.bucket is not None:
                del buckets[node.bucket][node.pidx]
            node.bucket = node.free_whole
            buckets.setdefault(node.free_whole, {})[node.pidx] = node
        if not node.mig:
            self._reindex_shared(node)

    def _reindex_shared(self, node: NodeState) -> None:
        best = 0
        for p, ok in enumerate(node.gpu_ok):
            if ok and node.gpu_slices[p] and not node.gpu_whole[p] and node.gpu_free[p] > best:
                best = node.gpu_free[p]
        pool = node.pool
        key = best // pool.granule if best > 0 else None
        if key != node.shared_key:
            shared = pool.shared_buckets[node.tier]
            if node.shared_key is not None:
                del shared[node.shared_key][node.pidx]
            if key is not None:
                shared.setdefault(key, {})[node.pidx] = node
            node.shared_key = key

    def refresh_index(self, node: NodeState) -> None:
        """Put ``node`` where its holders now place it in the indexes (after :meth:`seat`)."""
        if not node.accepts:
            return
        pool = node.pool
        if node.bucket != node.free_whole:
            buckets = pool.whole_buckets[node.tier]
            if node.bucket is not None:
                pool.free_whole_total -= node.bucket
                del buckets[node.bucket][node.pidx]
            pool.free_whole_total += node.free_whole
            node.bucket = node.free_whole
            buckets.setdefault(node.free_whole, {})[node.pidx] = node
        if not node.mig:
            self._reindex_shared(node)

    def unindex(self, node: NodeState) -> None:
        """Take ``node`` out of the indexes (it is being replaced)."""
        if not node.accepts:
            return
        pool = node.pool
        if node.bucket is not None:
            pool.free_whole_total -= node.bucket
            del pool.whole_buckets[node.tier][node.bucket][node.pidx]
            node.bucket = None
        if node.shared_key is not None:
            del pool.shared_buckets[node.tier][node.shared_key][node.pidx]
            node.shared_key = None

    def index_all(self) -> None:
        """Build the placement indexes once every running pod is accounted."""
        for pool in self.pools.values():
            pool.free_whole_total = 0
            for node in pool.nodes:
                if not node.accepts:
                    continue
                pool.free_whole_total += node.free_whole
                node.bucket = node.free_whole
                pool.whole_buckets[node.tier].setdefault(node.free_whole, {})[node.pidx] = node
                if not node.mig:
                    self._reindex_shared(node)
        self.indexed = True

    # ------------------------------------------------------------------
    # Queries
    # ------------------------------------------------------------------

    def job_request(self, tasks: list[TaskState]) -> list[int]:
        total = [0, 0, 0]
        for t in tasks:
            total[GPU] += t.milli
            total[CPU] += t.cpu
            total[MEMORY] += t.mem
        return total


def milli_of(request: GpuRequest, pool: PoolState | None) -> int:
    if request.whole:
        return request.whole * MILLI
    return request.milli_gpus(pool.reference_gpu_mem if pool is not None else 0)
