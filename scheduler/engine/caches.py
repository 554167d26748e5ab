"""What a session remembers between questions, kept apart from the working state.

The working state (:mod:`scheduler.engine.state`) is what the actions change
and a statement rolls back; the caches here are derived from it and only
make later questions cheap: the static verdict per pod shape, the last
search per shape that found no room, the victims' ranking and the
pending-reason analyses. The session owns one :class:`SessionCaches` and
hands it to placement, the victim search and the explanations. Keeping them
out of the state means the state knows nothing of the modules that read it,
and a test can run placement on a built state with cold caches.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from gpuwarden.contract import EvictionAction
from scheduler.engine.model import PendingReason
from scheduler.engine.rules import DomainCache
from scheduler.engine.state import Cluster, JobState, NodeState, PoolState, TaskState

# What makes two pods interchangeable for placement (see predicates.shape_of).
Shape = tuple[object, ...]


@dataclass(slots=True)
class Eligibility:
    """Static verdict per node of a pool (by ``pidx``) for one pod shape.

    ``few`` lists the eligible nodes when they are a small part of the pool
    (a node selector naming one rack, one host): placement then scores just
    those instead of skipping past every other node of the pool.
    """

    ok: list[bool]
    few: list[NodeState] | None


# Distinct shapes or affinities a pool's static verdicts remember before
# they start over: a bound on what a long-lived engine keeps of pods long gone.
MAX_STATIC_ENTRIES = 4096


@dataclass(slots=True, eq=False)
class PoolStatics:
    """What placement works out from a pool's nodes alone: their labels, taints and whether they take work.

    None of it changes while the pool's node states do, so a kept state
    (:mod:`scheduler.engine.incremental`) keeps it from session to session
    and drops it when one of the pool's nodes is replaced; a session that
    builds its state starts with an empty one.
    """

    eligibility: dict[Shape, Eligibility] = field(default_factory=dict)
    # (label key, value) -> pidx of the nodes carrying it, built on first use.
    label_index: dict[tuple[str, str], list[int]] | None = None
    # A pod's required node affinity (and its volumes') -> pidx of the nodes satisfying it.
    affinity: dict[tuple[object, ...], set[int]] = field(default_factory=dict)
    # Per pidx, whether the node takes work and has nothing a pod's shape
    # could fail on (no blocking taint, no MIG), and the accepting nodes
    # that do; built on first use by ``predicates.eligibility``.
    open_nodes: list[bool] | None = None
    irregular: list[int] = field(default_factory=list)

    def trim(self) -> None:
        """Forget the remembered shapes and affinities once there are too many of them."""
        if len(self.eligibility) > MAX_STATIC_ENTRIES:
            self.eligibility.clear()
        if len(self.affinity) > MAX_STATIC_ENTRIES:
            self.affinity.clear()


@dataclass(slots=True, eq=False)
class PoolCaches:
    """Placement's memory for one pool: the session's own, and the pool's static verdicts."""

    static: PoolStatics
    # Shape -> the cluster's release_version when a search for it found no
    # room: trusted only while nothing has been released since.
    fail: dict[Shape, int] = field(default_factory=dict)


@dataclass(slots=True)
class VictimIndex:
    """Running preemptible jobs, in victim order, per leaf queue and per pool.

    Built once per session (the order depends only on the snapshot); jobs
    evicted meanwhile stay listed and are skipped because none of their
    tasks is evictable any more.
    """

    by_queue: dict[str, list[JobState]]
    by_pool: dict[str, list[JobState]]


@dataclass(slots=True)
class NodeGroups:
    """A pool's nodes as one shape's static predicates see them.

    Eligible nodes are grouped by their free resources (identical nodes,
    the common case in a big pool, collapse into one group), so each pod
    shape is checked against a few dozen representatives, not every node.
    """

    total: int
    excluded: Counter[str]
    groups: list[tuple[NodeState, int]]  # (representative, how many alike)


class Backlog(Protocol):
    """What the actions ask of :class:`scheduler.engine.backlog.BacklogMemo`.

    Written here as an interface because the memo itself reads placement,
    which reads these caches.
    """

    def allocate_begins(self, cluster: Cluster) -> None: ...

    def allocate_ends(self, cluster: Cluster) -> None: ...

    def no_room(self, cluster: Cluster, job: JobState, gang: list[TaskState]) -> bool: ...

    def found_no_room(self, cluster: Cluster, job: JobState, gang: list[TaskState], *, counted: bool) -> None: ...

    def plan_failed_before(self, action: EvictionAction, job: JobState) -> bool: ...

    def plan_failed(self, action: EvictionAction, job: JobState) -> None: ...

    def no_plan_before(self, action: EvictionAction, job: JobState) -> tuple[str, ...] | None: ...

    def no_plan(self, action: EvictionAction, job: JobState, notes: tuple[str, ...]) -> None: ...


@dataclass(slots=True, eq=False)
class SessionCaches:
    """Everything one session caches; a fresh one per session."""

    pools: dict[str, PoolCaches] = field(default_factory=dict)
    victims: VictimIndex | None = None  # built on first use
    # Explanations, filled once the actions are done: node groups by
    # (pool, static predicates), analyses by (pool, shape, gang size).
    node_groups: dict[tuple[object, ...], NodeGroups] = field(default_factory=dict)
    reasons: dict[tuple[object, ...], PendingReason] = field(default_factory=dict)
    # Per pool, each node's free resources as explanations group them (by pidx).
    signatures: dict[str, list[tuple[object, ...]]] = field(default_factory=dict)
    # Per pool, every GPU on its nodes whatever their state (what a gang can never exceed).
    gpus_in_all: dict[str, int] = field(default_factory=dict)
    # Placement rules: eligible nodes per spread constraint, verdicts per pod.
    rules: DomainCache = field(default_factory=DomainCache)
    # What earlier sessions learned of the backlog (scheduler.engine.backlog),
    # when the caller keeps one, and each pool's static verdicts, when the
    # caller keeps the state they were worked out on: the only things here
    # that outlive the session.
    backlog: Backlog | None = None
    statics: dict[str, PoolStatics] = field(default_factory=dict)

    def pool(self, pool: PoolState) -> PoolCaches:
        found = self.pools.get(pool.name)
        if found is None:
            static = self.statics.get(pool.name)
            if static is None:
                static = self.statics[pool.name] = PoolStatics()
            else:
                static.trim()
            found = self.pools[pool.name] = PoolCaches(static)
        return found
