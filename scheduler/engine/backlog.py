"""What the last attempts learned about a deep backlog, kept from session to session.

A GPU cluster is over-subscribed by design: thousands of jobs wait for room
that will not come until work finishes, capacity returns or quotas move.
Without memory each session tries every one of them again from scratch:
allocate walks the pool for every gang, and reclaim, preempt and
consolidate search for victims for the first of them. :class:`BacklogMemo`
keeps two kinds of verdict, each with the argument that makes skipping it
safe; a skipped attempt is one the full attempt would also have lost, so a
session decides exactly what it decides without the memo (property tests
hold it to that). Nothing else changes: every job still takes its turn,
gets its reason and its explanation against the session's final state.

A skipped attempt must also leave the state exactly as the attempt would
have, down to the order of placement's buckets and of a node's pods: an
attempt that placed or evicted and then rolled back moves the nodes it
touched to the end of their buckets, and a later pod then lands elsewhere.
So only attempts that changed nothing are remembered.

**No room for a gang.** Allocate places a gang of ``k`` identical pods (one
shape: same requests, node selector, tolerations, node affinity, extended
resources; whole GPUs, no GPUs, or a slice of one GPU) greedily, pod by pod,
or not at all. Each such pod fits a node ``c(n)`` times over, ``c`` the
smallest of what its free whole GPUs (or the slices its GPUs' free memory
holds), free CPU, free memory and pod slots allow, and placing one lowers
exactly that node's ``c`` by one, whatever node the strategy picks. A gang
whose first pod found no node had every ``c(n)`` at 0, and they stay at 0
while room only shrinks; a gang refused by the pool's count of free whole
GPUs (``gangs.quick_reject``) stays refused while no node gains a free
GPU. Either way the attempt placed nothing, and would again. Such a
failure is remembered per (pool, shape, ``k``) -- for every job of that
shape, which is how identical pods are judged once -- and stands while the
pool's room has not grown:

- within a session, while ``PoolState.growth`` is unchanged (every release
  bumps it, except a rollback undoing the statement's own placements:
  failures are recorded only with no statement open, so a rollback returns
  to a state no roomier than any recorded one);
- from one session to the next, by comparing each node's room at the start
  of allocate with its room at the end of the last allocate. A node whose
  room grew in any way (a pod left, a GPU came back, its object changed, it
  is new) drops the "first pod found no node" of every shape that could now
  fit one pod there (a node that grew but still cannot hold a single pod of
  the shape keeps its ``c`` at 0), and, if it gained free whole GPUs, the
  count's refusals that the count no longer makes.

Gangs that placed some pods before failing are searched again each time.
Pods with rules that read the pods around them (affinity, anti-affinity,
spread, host ports, extended resources, or any running pod's
anti-affinity), slices over several GPUs, jobs with reserved room and
gangs of mixed pods are never memoised: their outcome is not monotone in
room, or not judged per pod alone. Limits and quotas are checked live before
the memo is read, so a changed quota or allocation gives its own reason.

**A plan that failed on paper, or none at all.** The victim searches read
the whole pool: running victims, queue shares, reservations. A plan that
failed without evicting anything (no release during it), and a job an
action made no plan for (with the notes it left, replayed), are kept only
while the session's input is the same as the one that recorded them: the same node, job and
queue objects, the same reservations, bystanders and config, and the same
verdict of every check that reads the clock (a reservation's expiry, a
short gang's grace). A session is a function of its input, so with the
same input it reaches every job in the same state as before: it gets no
plan again, or its plan fails on paper again. Anything at all changing clears them all: each
action tries at most ``MAX_BENEFICIARIES`` plans, so a changing cluster
pays a bounded cost, and an unchanged one pays only for the plans that
evicted before they failed.

Not thread-safe: one scheduling loop owns a memo, and hands it to each
session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuwarden.contract import EvictionAction
from gpuwarden.logconfig import get_logger
from scheduler.engine.gangs import quick_reject
from scheduler.engine.model import Job, Node, Snapshot
from scheduler.engine.predicates import static_exclusion
from scheduler.engine.rules import needs_verdict
from scheduler.engine.scoring import fit_on_node
from scheduler.engine.state import Cluster, JobState, NodeState, PoolState, TaskState

log = get_logger(__name__)

# A node's room as placement can use it: its object, whether it takes work,
# free CPU and memory, how many pods it holds, per GPU whether it is free
# whole and whether a whole-GPU pod holds it, and each GPU's free memory.
_Room = tuple[Node, bool, int, int, int, tuple[bool, ...], tuple[bool, ...], tuple[int, ...]]
# (pod shape, gang size): see predicates.shape_of.
_GangKey = tuple[tuple[object, ...], int]


def _room(node: NodeState) -> _Room:
    ok = node.gpu_ok
    whole = node.gpu_whole
    slices = node.gpu_slices
    return (
        node.spec,
        node.accepts,
        node.free_cpu,
        node.free_mem,
        len(node.tasks),
        tuple(ok[p] and not whole[p] and not slices[p] for p in range(len(ok))),
        tuple(w > 0 for w in whole),
        tuple(node.gpu_free),
    )


def _no_roomier(now: _Room, then: _Room) -> bool:
    """Whether no pod of any shape fits ``now`` more often than ``then`` (see the module docstring)."""
    if now == then:
        return True
    if now[0] is not then[0] or now[2] > then[2] or now[3] > then[3] or now[4] < then[4]:
        return False
    free_now, free_then = now[5], then[5]
    held_now, held_then = now[6], then[6]
    mem_now, mem_then = now[7], then[7]
    if len(free_now) != len(free_then):
        return False
    for p in range(len(free_now)):
        if (free_now[p] and not free_then[p]) or (held_then[p] and not held_now[p]) or mem_now[p] > mem_then[p]:
            return False
    return True


def _more_free_gpus(node: NodeState, then: _Room | None) -> bool:
    """Whether ``node`` adds to the free whole GPUs the pool's quick count sees (see ``gangs.quick_reject``)."""
    if not node.accepts:
        return False
    return then is None or not then[1] or node.free_whole > sum(then[5])


def _grew(node: NodeState, then: _Room | None) -> bool:
    """Whether ``node`` may offer more room than it did (a node that was not there always may)."""
    return then is None or not _no_roomier(_room(node), then)


def _detached(task: TaskState) -> TaskState:
    """A stand-in for a pod of a remembered shape that keeps nothing of its session alive.

    The check of a grown node asks the same static predicates and fit a
    pod of the shape would be asked; they read only the pod's own spec and
    requests.
    """
    job = task.job
    spec = Job(job.spec.name, job.spec.queue, namespace=job.spec.namespace, tasks=(task.spec,))
    owner = JobState(spec, job.key, None, None, job.preemptible)
    return TaskState(task.spec, owner, task.gpu, task.cpu, task.mem, task.milli, False, False, shape=task.shape)


@dataclass(slots=True, eq=False)
class _NoRoom:
    """A gang found without room, and how: refused by the quick count, or no node for its first pod."""

    pod: TaskState  # detached, of the gang's shape
    counted: bool


@dataclass(slots=True, eq=False)
class _PoolMemo:
    """One pool's gangs known not to fit, and the room they were judged against."""

    # PoolState.growth at which ``no_room`` holds (another session's pool
    # state counts from its own start, so this is set again each allocate).
    valid_at: int = -1
    no_room: dict[_GangKey, _NoRoom] = field(default_factory=dict)
    # Node name -> its room at the end of the last allocate, while ``no_room`` is not empty.
    reference: dict[str, _Room] | None = None


@dataclass(slots=True)
class BacklogCounts:
    """Attempts made and skipped, for tests and metrics (counts, never time)."""

    placements_tried: int = 0
    placements_skipped: int = 0
    plans_tried: int = 0
    plans_skipped: int = 0
    # Jobs an action would again make no plan for (its notes are replayed).
    no_plans_skipped: int = 0


def _same_input(old: Snapshot, new: Snapshot) -> bool:
    """Whether a session over ``new`` reads what one over ``old`` read (see the module docstring).

    Nodes and jobs are compared by name and identity, not by position: the
    session orders them itself, and the cycle hands over an unchanged
    object as the very same object but not always in the same place.
    Worked out only while a failed plan is remembered.
    """
    return (
        _clock_verdicts(old) == _clock_verdicts(new)
        and _same_objects({n.name: n for n in old.nodes}, {n.name: n for n in new.nodes}, len(new.nodes))
        and _same_objects({j.key: j for j in old.jobs}, {j.key: j for j in new.jobs}, len(new.jobs))
        and old.config == new.config
        and old.queues == new.queues
        and old.invalid_queues == new.invalid_queues
        and old.reservations == new.reservations
        and old.bystanders == new.bystanders
    )


def _same_objects(old: Mapping[str, object], new: Mapping[str, object], listed: int) -> bool:
    """The very same object under every name, and no name listed twice (``listed`` entries in all)."""
    return len(old) == len(new) == listed and all(old.get(name) is obj for name, obj in new.items())


def _clock_verdicts(snapshot: Snapshot) -> tuple[bool, ...]:
    """Every check of the session that reads the clock, as it comes out at this snapshot's time."""
    now = snapshot.now
    grace = snapshot.config.stale_gang_grace_s
    expired = tuple(r.expires <= now for r in snapshot.reservations)
    stale = tuple(
        now - job.below_min_member_since < grace for job in snapshot.jobs if job.below_min_member_since is not None
    )
    return (*expired, *stale)


class BacklogMemo:
    """The verdicts of failed attempts that stand until what they read changes (module docstring).

    ``counts`` are the last session's, ``totals`` every session's so far.
    """

    def __init__(self) -> None:
        self._pools: dict[str, _PoolMemo] = {}
        self._last: Snapshot | None = None
        self._plans: set[tuple[EvictionAction, str]] = set()
        # Jobs an action made no plan for, with the notes it left them.
        self._no_plans: dict[tuple[EvictionAction, str], tuple[str, ...]] = {}
        self.counts = BacklogCounts()
        self.totals = BacklogCounts()

    # -- the session ------------------------------------------------------------

    def begin(self, snapshot: Snapshot) -> None:
        """A session over ``snapshot`` starts: failed plans stand only if its input is the last one's."""
        self._fold()
        if (self._plans or self._no_plans) and (self._last is None or not _same_input(self._last, snapshot)):
            self._plans.clear()
            self._no_plans.clear()
        self._last = snapshot

    def abandon(self) -> None:
        """The session failed half-way: nothing it learned, nor anything before, is trusted."""
        self._pools.clear()
        self._plans.clear()
        self._no_plans.clear()
        self._last = None

    def _fold(self) -> None:
        c, t = self.counts, self.totals
        t.placements_tried += c.placements_tried
        t.placements_skipped += c.placements_skipped
        t.plans_tried += c.plans_tried
        t.plans_skipped += c.plans_skipped
        t.no_plans_skipped += c.no_plans_skipped
        self.counts = BacklogCounts()

    # -- allocation ---------------------------------------------------------------

    def allocate_begins(self, cluster: Cluster) -> None:
        """Keep the gangs still known not to fit: drop those a grown node could now take a pod of."""
        for name, memo in list(self._pools.items()):
            pool = cluster.pools.get(name)
            if pool is None or not memo.no_room or memo.reference is None:
                del self._pools[name]
                continue
            reference = memo.reference
            grown = [node for node in pool.nodes if _grew(node, reference.get(node.name))]
            if grown:
                more_gpus = any(_more_free_gpus(node, reference.get(node.name)) for node in grown)
                dropped = [
                    key
                    for key, verdict in memo.no_room.items()
                    if (
                        more_gpus and not quick_reject(pool, [verdict.pod] * key[1])
                        if verdict.counted
                        else _could_take_one(grown, verdict.pod)
                    )
                ]
                for key in dropped:
                    del memo.no_room[key]
                if dropped:
                    log.debug("backlog_room_grew", pool=name, nodes=len(grown), shapes_dropped=len(dropped))
            memo.valid_at = pool.growth
            memo.reference = None

    def allocate_ends(self, cluster: Cluster) -> None:
        """Note each pool's room as allocate leaves it: what the next session's room is compared with."""
        for name, memo in list(self._pools.items()):
            pool = cluster.pools.get(name)
            if pool is None:
                del self._pools[name]
                continue
            self._current(memo, pool)
            memo.reference = {node.name: _room(node) for node in pool.nodes} if memo.no_room else None

    def no_room(self, cluster: Cluster, job: JobState, gang: list[TaskState]) -> bool:
        """True when ``job``'s gang is known not to fit its pool now (limits already checked)."""
        pool = job.pool
        key = _gang_key(cluster, job, gang)
        if pool is None or key is None:
            self.counts.placements_tried += 1
            return False
        memo = self._pools.get(pool.name)
        if memo is not None and key in self._current(memo, pool):
            self.counts.placements_skipped += 1
            return True
        self.counts.placements_tried += 1
        return False

    def found_no_room(self, cluster: Cluster, job: JobState, gang: list[TaskState], *, counted: bool) -> None:
        """Allocate found no room for ``job``'s gang without placing any of it, with no statement open.

        ``counted``: the pool's count of free whole GPUs refused it
        (``gangs.quick_reject``); else no node had room for its first pod.
        """
        pool = job.pool
        key = _gang_key(cluster, job, gang)
        if pool is None or key is None:
            return
        memo = self._pools.get(pool.name)
        if memo is None:
            memo = self._pools[pool.name] = _PoolMemo(valid_at=pool.growth)
        self._current(memo, pool)[key] = _NoRoom(_detached(gang[0]), counted)

    @staticmethod
    def _current(memo: _PoolMemo, pool: PoolState) -> dict[_GangKey, _NoRoom]:
        """The pool's failures that still stand: none once room was released since they were judged."""
        if memo.valid_at != pool.growth:
            memo.no_room.clear()
            memo.valid_at = pool.growth
        return memo.no_room

    # -- victim searches ------------------------------------------------------------

    def plan_failed_before(self, action: EvictionAction, job: JobState) -> bool:
        """True when the same input already saw ``action``'s plan for ``job`` fail."""
        if (action, job.key) in self._plans:
            self.counts.plans_skipped += 1
            return True
        self.counts.plans_tried += 1
        return False

    def plan_failed(self, action: EvictionAction, job: JobState) -> None:
        self._plans.add((action, job.key))

    def no_plan_before(self, action: EvictionAction, job: JobState) -> tuple[str, ...] | None:
        """The notes ``action`` left ``job`` when the same input gave it no plan, else None."""
        found = self._no_plans.get((action, job.key))
        if found is not None:
            self.counts.no_plans_skipped += 1
        return found

    def no_plan(self, action: EvictionAction, job: JobState, notes: tuple[str, ...]) -> None:
        self._no_plans[(action, job.key)] = notes


def _could_take_one(nodes: list[NodeState], pod: TaskState) -> bool:
    """Whether one of ``nodes`` has room for one pod of ``pod``'s shape now (static predicates and fit)."""
    return any(static_exclusion(node, pod) is None and fit_on_node(node, pod) is not None for node in nodes)


def _gang_key(cluster: Cluster, job: JobState, gang: list[TaskState]) -> _GangKey | None:
    """What a gang's verdict is filed under, or None when it is never memoised (module docstring)."""
    if not gang or job.reserved:
        return None
    first = gang[0]
    shape = first.shape
    if not shape or any(t.shape is not shape and t.shape != shape for t in gang):
        return None
    gpu = first.gpu
    if gpu.is_slice and gpu.devices != 1:
        return None
    if needs_verdict(cluster, first):
        return None
    return shape, len(gang)
