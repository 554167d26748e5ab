"""The engine's input (Snapshot) and output (Decisions), as plain immutable data.

The Kubernetes side turns watched objects into a :class:`Snapshot` and turns
:class:`Decisions` into API calls; the engine in between sees nothing else.
Keeping both ends frozen dataclasses lets a test or a benchmark write a
cluster by hand, and lets the engine trust that nobody changes its input while
a session runs.

Units, everywhere in the engine:

- GPU: milli-GPUs (1000 = one whole GPU) when counting quota, limits and fair
  share; GPU memory in MiB per device.
- CPU: millicores.
- Memory: MiB.

Times are seconds since the epoch (floats), so a snapshot file can say
``created: 1700000000`` and the engine never deals with time zones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpuwarden.contract import DEFAULT_NODE_POOL, Action, EvictionAction, UnschedulableReason
from scheduler.engine.resources import CPU, GPU, MEMORY, MILLI

# Jobs at or above this priority are non-preemptible unless they say
# otherwise; KAI's "build" priority class (100) sits here too.
NON_PREEMPTIBLE_PRIORITY = 100

UNLIMITED = -1


class TaskStatus(StrEnum):
    """Where a pod is in its life, as far as placement cares.

    ``RELEASING`` pods (terminating) still hold their resources but can be
    neither placed nor evicted again.
    """

    PENDING = "Pending"
    RUNNING = "Running"
    RELEASING = "Releasing"


class PlacementStrategy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration with Kubernetes semantics (empty key + Exists = all)."""

    key: str = ""
    operator: str = "Equal"  # "Equal" or "Exists"
    value: str = ""
    effect: str = ""  # empty matches every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One requirement of a node selector term or a label selector.

    Operators are Kubernetes': ``In``, ``NotIn``, ``Exists``,
    ``DoesNotExist``, and for node selectors ``Gt`` and ``Lt`` (an integer
    compared with the label's value). The converter refuses any other.
    """

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeTerm:
    """A node selector term: every requirement holds (``fields`` name ``metadata.name``).

    A term with no requirement at all matches no node, as in Kubernetes.
    """

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A label selector over pods; empty matches every pod."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class PodTerm:
    """A pod affinity or anti-affinity term.

    ``selector`` None matches no pod (Kubernetes: a null label selector
    selects nothing). ``namespaces`` empty and not ``all_namespaces`` means
    the pod's own namespace. ``all_namespaces`` comes from an empty
    namespace selector, or, for anti-affinity, from a namespace selector
    with labels (namespaces are not watched, and counting more pods keeps
    an anti-affinity term safe; see :mod:`scheduler.cluster.convert`).
    """

    topology_key: str
    selector: LabelSelector | None
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A topology spread constraint; ``hard`` is ``whenUnsatisfiable: DoNotSchedule``.

    ``honor_affinity`` and ``honor_taints`` are its node inclusion policies
    (defaults Honor and Ignore, as Kubernetes'); ``selector`` already holds
    the pod's own values of ``matchLabelKeys``.
    """

    max_skew: int
    topology_key: str
    hard: bool
    selector: LabelSelector | None
    min_domains: int = 1
    honor_affinity: bool = True
    honor_taints: bool = False


@dataclass(frozen=True, slots=True)
class HostPort:
    """A container's host port; ``ip`` "0.0.0.0" (the default) conflicts with every address."""

    port: int
    protocol: str = "TCP"
    ip: str = "0.0.0.0"


@dataclass(frozen=True, slots=True)
class Placement:
    """Everything a pod says about where it may or would like to go, beyond its requests.

    ``node_terms`` are required node affinity (any term; volume node
    affinity is added as further terms that must all hold, in
    ``volume_terms``). Preferred terms carry their weight (1-100).
    """

    node_terms: tuple[NodeTerm, ...] = ()
    volume_terms: tuple[tuple[NodeTerm, ...], ...] = ()
    preferred_nodes: tuple[tuple[int, NodeTerm], ...] = ()
    affinity: tuple[PodTerm, ...] = ()
    anti_affinity: tuple[PodTerm, ...] = ()
    preferred_affinity: tuple[tuple[int, PodTerm], ...] = ()
    preferred_anti_affinity: tuple[tuple[int, PodTerm], ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    ports: tuple[HostPort, ...] = ()
    # Nodes the pod must not go to for now, sorted: their kubelet's device
    # manager started a pod of its job on a GPU out of service, and may
    # again (scheduler.cluster.misplaced backs off from them).
    avoid: tuple[str, ...] = ()

    @property
    def static(self) -> tuple[object, ...]:
        """The part judged once per node (node affinity, avoided nodes), for the eligibility cache."""
        return (self.node_terms, self.volume_terms, self.avoid)

    @property
    def dynamic(self) -> bool:
        """Whether the verdict depends on the pods around (pod affinity, spread, ports)."""
        return bool(self.affinity or self.anti_affinity or self.spread or self.ports)

    @property
    def scored(self) -> bool:
        """Whether candidate nodes are ranked by preference, not the strategy alone."""
        return bool(
            self.preferred_nodes
            or self.preferred_affinity
            or self.preferred_anti_affinity
            or any(not c.hard for c in self.spread)
        )


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """One of the agent's NodeConditions, already read off the Node.

    ``action`` is the recommended action the agent wrote in the message and
    ``gpu_indices`` the GPUs the message names (empty when it names none, or
    names the node as a whole); the Kubernetes side parses both once so the
    engine never reads free text.
    """

    type: str
    status: bool
    reason: str = ""
    message: str = ""
    action: Action = Action.NONE
    gpu_indices: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of a node.

    ``offered`` is whether the device plugin offers it to the kubelet
    (PodResources ``GetAllocatableResources``, published by the agent); None
    where nobody said. A GPU out of service that is still offered is a trap
    on a device-plugin node: the kubelet's device manager may hand it to the
    next whole-GPU pod, whatever gpuwarden assigned.

    ``faulted_since`` is when the agent first reported a fault still listed
    on this GPU (the earliest GPUNode fault ``since``, in seconds since the
    epoch, on the node's clock); None when it lists none or did not say.
    It tells a pod the device manager started on a GPU already faulted
    from one whose GPU failed under it (:mod:`scheduler.engine.holders`).

    A MIG device that NVIDIA's DRA driver publishes is a GPU of its own
    here, carved from the GPU ``parent`` (whose index it names; the parent
    is in MIG mode, so takes nothing itself). Only a pod whose DRA claims
    select the device takes it (its :class:`DeviceFilter` names the index):
    never a device-plugin or slice pod. ``milli_gpus`` is what it counts
    for, in capacity and in the charge of the pod holding it: a MIG device
    is a share of its parent, a whole GPU 1000.
    """

    index: int
    uuid: str = ""
    memory_mib: int = 81920
    healthy: bool = True
    mig_enabled: bool = False
    offered: bool | None = None
    faulted_since: float | None = None
    parent: int | None = None
    milli_gpus: int = MILLI


@dataclass(frozen=True, slots=True)
class Node:
    """A node as the engine sees it.

    ``schedulable`` is False when cordoned; ``draining`` is set while
    remediation drains the node (its pods are evicted by health eviction).
    """

    name: str
    pool: str = DEFAULT_NODE_POOL
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    schedulable: bool = True
    conditions: tuple[NodeCondition, ...] = ()
    draining: bool = False
    # Allocatable of every other resource (ephemeral-storage, hugepages,
    # extended resources), in thousandths of its unit; and how many pods
    # the kubelet admits (0: not said).
    extended: Mapping[str, int] = field(default_factory=dict)
    max_pods: int = 0
    # Which GPUs each pod really holds, as the node's kubelet reports it (the
    # agent publishes its PodResources answers in the GPUNode): pod UID, or
    # ``namespace/name`` for a holder the agent could not read the UID of,
    # to GPU indices. It wins over a pod's assignment annotation, which is
    # only gpuwarden's guess for whole GPUs on a device-plugin node (see
    # :mod:`scheduler.engine.holders`). None where the node publishes no
    # such mapping (an older agent, a PodResources socket never read).
    kubelet_holders: Mapping[str, tuple[int, ...]] | None = None


@dataclass(frozen=True, slots=True)
class QueueResource:
    """Quota (deserved), limit and over-quota weight for one resource.

    ``quota`` and ``limit`` are in engine units (see the module docstring);
    ``UNLIMITED`` (-1) means no bound. A resource with neither bound is not
    governed for the queue (see :data:`UNGOVERNED`).
    """

    quota: int = 0
    limit: int = UNLIMITED
    over_quota_weight: float = 1.0

    @property
    def governed(self) -> bool:
        """False when the queue puts no bound on this resource at all."""
        return self.quota != UNLIMITED or self.limit != UNLIMITED


# A resource a queue does not name: no quota to stay within, no limit, and
# a fair share of whatever it asks for (as much as siblings leave). Quota
# and limit both unbounded say exactly that to every check (limits, the
# non-preemptible-within-quota rule, fair share), so a GPU-only queue tree
# needs no CPU or memory numbers and the hot paths need no extra branch.
UNGOVERNED = QueueResource(quota=UNLIMITED, limit=UNLIMITED)


@dataclass(frozen=True, slots=True)
class Queue:
    """A node of the queue tree; only leaves (queues nobody names as parent) take jobs.

    A resource left at its default is not governed for this queue
    (:data:`UNGOVERNED`): a queue that only sets ``gpu`` bounds GPUs and
    nothing else.
    """

    name: str
    parent: str | None = None
    priority: int = 0
    node_pool: str = DEFAULT_NODE_POOL
    gpu: QueueResource = UNGOVERNED
    cpu: QueueResource = UNGOVERNED
    memory: QueueResource = UNGOVERNED

    @property
    def resources(self) -> tuple[QueueResource, QueueResource, QueueResource]:
        """In the engine's resource order: GPU, CPU, memory."""
        return (self.gpu, self.cpu, self.memory)


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """Which GPUs a pod's DRA claims may be given, per node: the devices their selectors select.

    Worked out at the edge (``scheduler.cluster.claims``: CEL selectors of
    the claims' requests and DeviceClasses over NVIDIA's DRA devices, their
    taints) so that the engine only reads plain indices. ``key`` names what
    the sets were derived from (the requests and classes, as text): pods
    with equal keys are interchangeable for placement, and a cached "nothing
    fits" is filed under it. A node absent from ``nodes`` has no GPU the
    pod may take.
    """

    key: str
    nodes: Mapping[str, frozenset[int]]
    # Nodes where any free GPU will do: a device plugin serves the pod's
    # ``nvidia.com/gpu`` there (a pod whose extended resource DRA serves on
    # the other nodes, KEP-5004).
    plain: frozenset[str] = frozenset()
    # Where one set per node is not enough to say it (requests whose
    # selectors differ, ``matchAttribute`` constraints): per node, the
    # alternatives (one per group of devices sharing the constrained
    # attributes), each the requests in order as (count, the GPUs it may
    # take). The pod fits where one alternative can give every request its
    # count of distinct free GPUs (:func:`assign_devices`). ``nodes`` is
    # then the union, for the quick checks and the explanations.
    choices: Mapping[str, DeviceChoices] = field(default_factory=dict)

    def pick(self, node: str, free: Sequence[int], count: int) -> list[int] | None:
        """``count`` GPUs of ``free`` (indices, in the order to prefer) the pod may take on ``node``; None if none do.

        The chosen ones keep ``free``'s order. With :attr:`choices` for the
        node, an assignment to the requests must exist (:func:`assign_devices`).
        """
        if count <= 0:
            return []
        alternatives = self.choices.get(node) if node not in self.plain else None
        if alternatives is None:
            allowed = None if node in self.plain else self.nodes.get(node)
            if allowed is None and node not in self.plain:
                return None
            chosen = [i for i in free if allowed is None or i in allowed][:count]
            return chosen if len(chosen) >= count else None
        assigned = assign_devices(alternatives, free)
        if assigned is None:
            return None
        taken = {i for group in assigned for i in group}
        return [i for i in free if i in taken]


# Per request, in order: how many GPUs, and which it may take.
DeviceRequests = tuple[tuple[int, frozenset[int]], ...]
# A node's alternatives: each a full set of requests (see DeviceFilter.choices).
DeviceChoices = tuple[DeviceRequests, ...]


def assign_devices(alternatives: DeviceChoices, free: Sequence[int]) -> list[list[int]] | None:
    """Distinct GPUs of ``free`` for every request of the first alternative that can have them, per request.

    A bipartite matching (each request expanded into its count of slots,
    each slot to one GPU it may take), by augmenting paths: a GPU taken by
    an earlier slot is handed over to a later one when the earlier can take
    another. Deterministic: slots in request order, GPUs in ``free``'s
    order, so the scheduler's placement and the binder that writes the
    allocation find the same assignment. Sizes are a node's GPUs (eight or
    so), so the cubic worst case is nothing.
    """
    for requests in alternatives:
        found = _match(requests, free)
        if found is not None:
            return found
    return None


def _match(requests: DeviceRequests, free: Sequence[int]) -> list[list[int]] | None:
    """One alternative of :func:`assign_devices`: its requests' GPUs, or None when they cannot all have theirs."""
    slots = [r for r, (count, _) in enumerate(requests) for _ in range(count)]
    if len(slots) > len(free):
        return None
    holder: dict[int, int] = {}  # GPU -> the slot that has it

    def take(slot: int, seen: set[int]) -> bool:
        allowed = requests[slots[slot]][1]
        for gpu in free:
            if gpu in allowed and gpu not in seen:
                seen.add(gpu)
                other = holder.get(gpu)
                if other is None or take(other, seen):
                    holder[gpu] = slot
                    return True
        return False

    if not all(take(slot, set()) for slot in range(len(slots))):
        return None
    out: list[list[int]] = [[] for _ in requests]
    for gpu in free:  # in free's order, so each request's GPUs are too
        if gpu in holder:
            out[slots[holder[gpu]]].append(gpu)
    return out


@dataclass(frozen=True, slots=True)
class Task:
    """A pod.

    Whole GPUs come from ``gpus`` (the ``nvidia.com/gpu`` request); a GPU
    slice comes from the pod's annotations (fraction or MiB, optionally on N
    devices), parsed by the engine so that a malformed value becomes a reason
    on the job instead of a crash. Running pods carry their node and the GPU
    indices they hold. ``refusal``, when set, is why the Kubernetes side
    says the pod must not be placed at all (a GPU slice pod that would not
    obey its slice on the node): its job stays pending with that reason.

    ``labels`` and ``placement`` are what Kubernetes' placement rules read
    (:mod:`scheduler.engine.rules`): a running pod's labels and its
    required anti-affinity bind the pods placed near it, as kube-scheduler
    holds them. ``terminating`` is a pod with a deletion timestamp
    (topology spread does not count it; other schedulers' pods are all
    ``RELEASING``, so the status cannot say it).
    """

    name: str
    namespace: str = "default"
    uid: str = ""
    status: TaskStatus = TaskStatus.PENDING
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    refusal: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    placement: Placement | None = None
    # Requests of every other resource, in thousandths of its unit.
    extended: tuple[tuple[str, int], ...] = ()
    terminating: bool = False
    # Why the pod's placement rules cannot be judged (UnsupportedPlacement).
    unplaceable: str = ""
    # A pending pod's volume claims (persistentVolumeClaim and generic
    # ephemeral volumes), which the Kubernetes side judges before the
    # engine sees the pod (scheduler.cluster.volumes).
    claims: tuple[str, ...] = ()
    # A running pod's ``status.startTime`` (the kubelet's clock) as seconds
    # since the epoch, parsed at the edge (scheduler.cluster.convert); None
    # when not said or unreadable. Read only where a holder must be dated
    # (scheduler.engine.holders).
    started: float | None = None
    # For a pending pod whose whole GPUs come from DRA claims: which GPUs of
    # which node its claims may take (``gpus`` is how many). None: any free
    # GPU, as for the device plugin's ``nvidia.com/gpu``.
    devices: DeviceFilter | None = None
    # A running pod whose GPUs its DRA claims hold (the allocation says
    # which): consolidation does not move it, since the pod that comes back
    # has claims whose selectors the move does not know.
    claimed: bool = False
    # Milli-GPUs the pod is charged where its GPUs are not whole ones (MIG
    # devices through DRA claims: the shares of the devices it holds, or
    # for a pending pod the largest its claims may be given); None: 1000
    # per GPU, or its slice.
    gpu_milli: int | None = None


@dataclass(frozen=True, slots=True)
class Job:
    """A pod group: its tasks are placed together (at least ``min_member``).

    ``tasks`` are the members still to run or running. Members that have
    finished are only counted: ``succeeded`` ones count toward
    ``min_member`` (a batch Job whose first pods completed is no smaller a
    gang for it, and its remaining pods place without waiting for the
    finished ones to come back), ``failed`` ones count for nothing; neither
    holds resources. ``failed`` is there for the group's status, which
    says Failed when nothing is left to run and the gang did not complete.

    ``preemptible`` None means "infer from priority". ``below_min_member_since``
    is when the Kubernetes side first saw the running gang below
    ``min_member`` after it lost a member (None while it is whole, or has
    only not grown to it yet); stale-gang eviction compares it with the
    snapshot time.
    """

    name: str
    queue: str
    namespace: str = "default"
    uid: str = ""
    priority: int = 0
    preemptible: bool | None = None
    min_member: int = 1
    created: float = 0.0
    tasks: tuple[Task, ...] = ()
    below_min_member_since: float | None = None
    succeeded: int = 0
    failed: int = 0
    # ``namespace/name``, made once: every per-job pass of every cycle reads
    # it, thousands of times a cycle, and formatting it on each read was a
    # measurable share of a cycle.
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.name}")

    @property
    def is_preemptible(self) -> bool:
        if self.preemptible is not None:
            return self.preemptible
        return self.priority < NON_PREEMPTIBLE_PRIORITY


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Settings of one scheduler; per-pool placement strategy."""

    default_strategy: PlacementStrategy = PlacementStrategy.BINPACK
    pool_strategies: Mapping[str, PlacementStrategy] = field(default_factory=dict)
    stale_gang_grace_s: float = 60.0
    # How long room freed for a job is held for it (see Reservation): long
    # enough for evicted pods to finish their termination grace period.
    reservation_ttl_s: float = 300.0

    def strategy(self, pool: str) -> PlacementStrategy:
        return self.pool_strategies.get(pool, self.default_strategy)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Room on one node held for one job across sessions, until it binds or ``expires``.

    Actions free room for a job by evicting others (reclaim, preemption,
    consolidation); the evicted pods take their grace period to leave, so the
    job's pods cannot bind in the session that decided it. Without a
    reservation the next session would see the room come free and could
    give it to anyone. While the room is still held by terminating pods the
    job waits for it (no further evictions are made on its behalf); once
    free, the room is seated for the job and no other job can take it.

    ``gpu_memory_mib`` is the slice per GPU for fractional room (None for
    whole GPUs); ``job`` is the job key (``namespace/name``).
    """

    job: str
    node: str
    gpu_indices: tuple[int, ...] = ()
    gpu_memory_mib: tuple[int, ...] | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    expires: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one session schedules from.

    ``invalid_queues`` names, with what is wrong, the queues that exist but
    could not be read (a quota no cluster holds): they are not in ``queues``,
    and their jobs wait saying so rather than that the queue does not exist.
    """

    nodes: tuple[Node, ...] = ()
    queues: tuple[Queue, ...] = ()
    jobs: tuple[Job, ...] = ()
    now: float = 0.0
    config: SchedulerConfig = SchedulerConfig()
    reservations: tuple[Reservation, ...] = ()
    invalid_queues: tuple[tuple[str, str], ...] = ()
    # Pods bound to nodes that take no work of ours (other schedulers'
    # pods on a cordoned node, a CPU node): they hold nothing the engine
    # places, but pod affinity and topology spread count them by their
    # labels, as kube-scheduler does.
    bystanders: tuple[Task, ...] = ()


# --------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource vector in engine units (milli-GPU, millicores, MiB)."""

    gpu: int = 0
    cpu: int = 0
    memory: int = 0

    @classmethod
    def of(cls, values: list[int] | tuple[int, ...]) -> Resources:
        return cls(values[GPU], values[CPU], values[MEMORY])


@dataclass(frozen=True, slots=True)
class Bind:
    """Bind one pod to a node and to GPUs on it.

    ``gpu_memory_mib`` is the slice per GPU for fractional pods (None for
    whole GPUs or none). ``pipelined`` binds wait for evictions decided in the
    same session on that node to finish before they are executed.
    """

    job: str
    namespace: str
    pod: str
    uid: str
    node: str
    gpu_indices: tuple[int, ...] = ()
    gpu_memory_mib: tuple[int, ...] | None = None
    pipelined: bool = False


@dataclass(frozen=True, slots=True)
class Eviction:
    """Evict one pod; ``beneficiary`` is the job the room is made for, if any."""

    job: str
    namespace: str
    pod: str
    uid: str
    node: str
    action: EvictionAction
    reason: str
    beneficiary: str | None = None


@dataclass(frozen=True, slots=True)
class PendingReason:
    code: UnschedulableReason
    message: str


@dataclass(frozen=True, slots=True)
class JobStatus:
    """Why a job is still (wholly or partly) pending after the session."""

    job: str
    queue: str
    reasons: tuple[PendingReason, ...]


@dataclass(frozen=True, slots=True)
class QueueShare:
    """A queue's fair share and what it holds, for the Queue status.

    ``quota_shortfall`` is the part of the queue's quota that healthy
    hardware does not back right now (see
    :func:`scheduler.engine.decisions.quota_shortfalls`); ``quota`` (0 where
    the queue sets none), ``backing`` and ``level_quota`` are the figures
    that explain it: what backs the queue's level of the tree (the pool's
    healthy capacity for a top-level queue, the backed part of the parent's
    quota for a child) and the sum of the quotas at that level. ``parent``
    is empty for a top-level queue. They let a Queue's status say that a
    fault, not another team, is why its work waits.

    ``guaranteed`` is what reclaim will win back for the queue from queues
    holding more than their own guarantee: ``min(quota, fair share)`` (its
    fair share where it sets no quota). ``guarantee_note`` is empty unless
    part of what the queue's quota promises at its current demand is not
    guaranteed, and then says how much and why (quotas at its level add up
    to more than backs them).
    """

    queue: str
    pool: str
    fair_share: Resources
    allocated: Resources
    request: Resources
    allocated_non_preemptible: Resources = Resources()
    quota_shortfall: Resources = Resources()
    quota: Resources = Resources()
    backing: Resources = Resources()
    level_quota: Resources = Resources()
    parent: str = ""
    guaranteed: Resources = Resources()
    guarantee_note: str = ""


@dataclass(frozen=True, slots=True)
class Decisions:
    """What the session decided.

    ``reservations`` is every reservation that should hold after this
    session: the snapshot's that are still valid and unused, and new ones
    for the room this session's evictions are freeing (pipelined binds and
    consolidation's moved pods). The executor keeps them, minus those whose
    bind went through at once.
    """

    binds: tuple[Bind, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    pending: tuple[JobStatus, ...] = ()
    queue_shares: tuple[QueueShare, ...] = ()
    reservations: tuple[Reservation, ...] = ()
