"""The victim search: making room for one pending job by evicting others.

Used by consolidate, reclaim and preempt through the shared loop in
:mod:`scheduler.engine.eviction_plan`; they differ only in who may be a
victim and which evictions are admissible.

What is evicted. A victim is a *unit* of one running job: the whole job
(all its pods, on every node: half a gang is worth nothing to anyone), or,
for an elastic job running more pods than its ``minMember``, some of its pods
beyond ``minMember`` on the node being cleared (a *shrink*: one pod, two, up
to all it may lose there, newest first). A job's shrinks are always tried
before the whole job, so an elastic job loses its extras first, only as many
as the room needs, and its gang only when that is not enough.

What a plan costs, compared as a tuple, cheapest first::

    (highest priority among the victims, milli-GPUs evicted, pods evicted)

so a plan never evicts higher-priority work when lower-priority work would
do, then frees as few GPUs, then disturbs as few pods as it can; among plans
of equal cost the youngest victims go first (the victim order).

How the search works, per pod of the beneficiary's gang that does not fit
anywhere as things stand:

1. Nodes it could use (static predicates pass, and evicting every candidate
   there would free enough) are found through the victims, cheapest victim
   first: at most ``MAX_NODES_SCANNED`` nodes are looked at and
   ``MAX_NODES_TRIED`` kept. For each a lower bound on any plan's cost there
   is computed from the node alone, and nodes are searched in that order;
   the search stops as soon as the best plan found costs no more than a
   lower bound of every node left (the node's *floor*: the fewest victims
   whose GPUs there add up to the missing ones), which in the common case is
   right after the first node.
2. On a node, the first plan is the greedy one (units in victim order until
   the pod fits, then every unit the later ones made unnecessary spared),
   worked out on the node's figures without touching the state. If it costs
   more than the node's floor, cheaper sets are enumerated: subsets of at
   most ``MAX_VICTIMS_PER_NODE`` units among the ``MAX_UNITS_PER_NODE``
   cheapest on the node, pruned by cost and by fit (a superset of a set that
   fits costs more, so none is looked at). The sets that fit on paper are
   then tried for real in cost order, at most ``MAX_TRIALS_PER_NODE`` of
   them: each unit's eviction must be ``admissible`` when it happens (units
   go smallest first, which is the order that lets the most sets through a
   rule of the kind "the queue must still hold more than X before this
   eviction"), the pod must fit, and the action's ``step`` (consolidation:
   every moved pod finds a new place) must succeed; an action's ``screen``
   may refuse a set on paper first, when its step could not succeed after
   it (consolidation: the moved pods' whole GPUs cannot fit anywhere). A set that fails any of
   these is undone and the next one tried; then the next node.

So the search backtracks over victims and nodes, not over pods: once a pod
of a gang is placed its plan stays, and a later pod that finds no plan rolls
the whole gang's plan back. Within those bounds it is complete: whenever a
set of at most ``MAX_VICTIMS_PER_NODE`` units on one of the tried nodes makes
room admissibly, it finds one no costlier (the greedy plan also covers
larger sets, without that promise). The bounds exist because a session
plans for up to ``eviction_plan.MAX_BENEFICIARIES`` jobs per action on
clusters of thousands of nodes: four victims per node covers every
whole-GPU node of up to four GPUs (bigger plans are found greedily), and the
``MAX_UNITS_PER_NODE`` cheapest units keep the enumeration to
at most 162 paper checks per node (eight units: every whole-GPU victim of an
eight-GPU node).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpuwarden.contract import EvictionAction, UnschedulableReason
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.limits import limit_problem
from scheduler.engine.predicates import eligibility
from scheduler.engine.reservations import release_for, reserved_place
from scheduler.engine.resources import CPU, GPU, MEMORY, RESOURCES, GpuRequest
from scheduler.engine.scoring import fits, place_for, trap_rank
from scheduler.engine.state import Cluster, JobState, NodeState, TaskState
from scheduler.engine.statement import Statement

MAX_NODES_TRIED = 8
MAX_NODES_SCANNED = 256
MAX_VICTIMS_PER_NODE = 4
MAX_UNITS_PER_NODE = 8
MAX_TRIALS_PER_NODE = 32

Predicate = Callable[[JobState], bool]
# May these pods of this job be evicted now? Asked just before the eviction.
Admissible = Callable[[JobState, Sequence[TaskState]], bool]
# A last check of one placement, against the state with its room made:
# given the statement and its mark before the room was made.
Step = Callable[[Statement, int], bool]
# A check of one set of evictions on paper, before any is made: given the node
# being cleared, the pod to place there and every pod the set would evict,
# False when the step could not succeed after them (so the trial is skipped).
Screen = Callable[[NodeState, TaskState, Sequence[TaskState]], bool]
Cost = tuple[int, int, int]


def evictable(task: TaskState) -> bool:
    """Running, not terminating, not evicted yet, and a pod (a reservation's placeholder is none)."""
    return (
        task.was_running
        and task.node is not None
        and not task.releasing
        and task.eviction is None
        and not task.placeholder
    )


def victim_order(job: JobState) -> tuple[int, float, str]:
    """Cheapest victims first: lowest priority, then youngest, then name."""
    return (job.spec.priority, -job.spec.created, job.key)


def build_victim_index(cluster: Cluster) -> VictimIndex:
    ranked = sorted(
        (
            j
            for j in cluster.jobs
            if j.preemptible and j.queue is not None and j.pool is not None and any(evictable(t) for t in j.tasks)
        ),
        key=victim_order,
    )
    by_queue: dict[str, list[JobState]] = {}
    by_pool: dict[str, list[JobState]] = {}
    for job in ranked:
        assert job.queue is not None and job.pool is not None
        by_queue.setdefault(job.queue.name, []).append(job)
        by_pool.setdefault(job.pool.name, []).append(job)
    return VictimIndex(by_queue, by_pool)


def victim_index(cluster: Cluster, caches: SessionCaches) -> VictimIndex:
    """The session's victim index, built on first use."""
    if caches.victims is None:
        caches.victims = build_victim_index(cluster)
    return caches.victims


def evict_job(stmt: Statement, victim: JobState, action: EvictionAction, reason: str, beneficiary: str) -> None:
    for task in victim.tasks:
        if evictable(task):
            stmt.evict(task, action, reason, beneficiary)


def held_by(tasks: Iterable[TaskState]) -> list[int]:
    """GPU (milli), CPU and memory that ``tasks`` hold, in the engine's resource order."""
    held = [0, 0, 0]
    for t in tasks:
        held[GPU] += t.milli
        held[CPU] += t.cpu
        held[MEMORY] += t.mem
    return held


def surplus(job: JobState) -> int:
    """How many running pods ``job`` may lose and still be a whole gang (its pods beyond minMember)."""
    return max(0, job.satisfied - job.spec.min_member)


# --------------------------------------------------------------------------
# One node, on paper
# --------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Unit:
    """What evicting one victim takes: a job's pods, and what they hold on the node being cleared."""

    job: JobState
    tasks: list[TaskState]
    order: int  # the job's place in victim order on this node
    shrink: bool
    cpu: int = 0
    mem: int = 0
    whole: dict[int, int] = field(default_factory=dict)  # position -> whole holders freed
    slices: dict[int, tuple[int, int]] = field(default_factory=dict)  # position -> (holders, MiB) freed
    gpu: int = 0  # milli-GPUs evicted, on every node
    pods: int = 0

    @property
    def priority(self) -> int:
        return self.job.spec.priority


def _unit(job: JobState, tasks: list[TaskState], node: NodeState, order: int, shrink: bool) -> _Unit:
    unit = _Unit(job, tasks, order, shrink, gpu=sum(t.milli for t in tasks), pods=len(tasks))
    for t in tasks:
        if t.node is not node:
            continue
        unit.cpu += t.cpu
        unit.mem += t.mem
        if t.slices:
            for p, s in zip(t.gpu_pos, t.slices, strict=True):
                count, mib = unit.slices.get(p, (0, 0))
                unit.slices[p] = (count + 1, mib + s)
        else:
            for p in t.gpu_pos:
                unit.whole[p] = unit.whole.get(p, 0) + 1
    return unit


@dataclass(slots=True, eq=False)
class _NodeView:
    """A node the pod could use once victims go: its candidate jobs and two bounds on any plan's cost.

    ``bound`` orders the nodes (it is the search order the module docstring
    describes); ``floor``, never below it, is the tighter bound that says
    when a plan already found cannot be beaten here, so the search stops as
    soon as it can without changing which plan it finds. Both come from the
    candidate pods alone; the units are built only for a node the search
    reaches (most are not: the first node's plan usually meets every floor).
    """

    node: NodeState
    task: TaskState
    jobs: list[tuple[JobState, list[TaskState]]]  # candidate jobs in victim order, with their pods here
    bound: Cost
    floor: Cost
    built: list[_Unit] | None = None

    @property
    def units(self) -> list[_Unit]:
        """The node's units for the pod (built on first use: the state is then as it was surveyed,
        since the search rolls every other node's trial back before it looks at another)."""
        if self.built is None:
            self.built = _units(self.node, self.task, self.jobs)
        return self.built


def _survey(node: NodeState, task: TaskState, is_candidate: Predicate) -> _NodeView | None:
    """The node's candidate jobs, if evicting all of them would free enough for ``task``; else None."""
    found: dict[int, tuple[JobState, list[TaskState]]] = {}
    for t in node.tasks:
        if evictable(t) and is_candidate(t.job):
            entry = found.get(id(t.job))
            if entry is None:
                found[id(t.job)] = (t.job, [t])
            else:
                entry[1].append(t)
    if not found:
        return None
    # Everything at once first: every job's largest unit frees exactly its
    # candidate pods here, and a unit that frees nothing the pod lacks
    # (which :func:`_units` drops) changes nothing in the check.
    if not _fits_without(node, task, found.values()):
        return None
    jobs = sorted(found.values(), key=lambda e: victim_order(e[0]))
    # What the bounds read of the units, from each job's largest one: it
    # holds all its candidate pods here, and frees all any smaller one does.
    short_cpu = node.free_cpu < task.cpu
    short_mem = node.free_mem < task.mem
    wants_gpu = task.gpu.whole > 0 or task.gpu.is_slice
    lowest: int | None = None
    reach: list[int] = []  # per useful job, the GPUs here it holds
    most = 0  # the most GPUs here one job holds whole
    sliced = False
    for job, here in jobs:
        cpu = mem = 0
        whole: set[int] = set()
        shared: set[int] = set()
        for t in here:
            cpu += t.cpu
            mem += t.mem
            (shared if t.slices else whole).update(t.gpu_pos)
        if not ((wants_gpu and (whole or shared)) or (short_cpu and cpu > 0) or (short_mem and mem > 0)):
            continue
        priority = job.spec.priority
        lowest = priority if lowest is None else min(lowest, priority)
        reach.append(len(whole | shared))
        most = max(most, len(whole))
        sliced = sliced or bool(shared)
    if lowest is None:
        return None
    bound, floor = _bounds(node, task, lowest=lowest, reach=reach, most=most, sliced=sliced)
    return _NodeView(node, task, jobs, bound, floor)


def _units(node: NodeState, task: TaskState, jobs: list[tuple[JobState, list[TaskState]]]) -> list[_Unit]:
    """The units on ``node`` of these candidate jobs (in victim order) that free something ``task`` lacks."""
    units: list[_Unit] = []
    for order, (job, here) in enumerate(jobs):
        spare = surplus(job)
        if spare > 0:
            # Shrinks by one pod more each, newest pods first, before the whole job.
            here.sort(key=lambda t: t.rank)
            for k in range(1, min(spare, len(here)) + 1):
                units.append(_unit(job, here[-k:], node, order, shrink=True))
            if spare >= len(here):
                continue  # the shrink frees all it holds here: the whole job would free nothing more
        units.append(_unit(job, [t for t in job.tasks if evictable(t)], node, order, shrink=False))
    # Only units that free something the pod lacks here are worth a look.
    short_cpu = node.free_cpu < task.cpu
    short_mem = node.free_mem < task.mem
    wants_gpu = task.gpu.whole > 0 or task.gpu.is_slice
    return [
        u
        for u in units
        if (wants_gpu and (u.whole or u.slices)) or (short_cpu and u.cpu > 0) or (short_mem and u.mem > 0)
    ]


def _fits_without(node: NodeState, task: TaskState, jobs: Iterable[tuple[JobState, list[TaskState]]]) -> bool:
    """Would ``task`` fit on ``node``, on paper, with every listed pod on it gone (see :func:`_fits`)?"""
    cpu = node.free_cpu
    mem = node.free_mem
    gpu = task.gpu
    wants_gpu = gpu.whole > 0 or gpu.is_slice
    whole: list[int] | None = None
    sliced: list[int] | None = None
    free: list[int] | None = None
    if wants_gpu:
        whole = list(node.gpu_whole)
        sliced = list(node.gpu_slices)
        free = list(node.gpu_free)
    for _, here in jobs:
        for t in here:
            cpu += t.cpu
            mem += t.mem
            if whole is None or sliced is None or free is None:
                continue
            if t.slices:
                for p, s in zip(t.gpu_pos, t.slices, strict=True):
                    sliced[p] -= 1
                    free[p] += s
            else:
                for p in t.gpu_pos:
                    whole[p] -= 1
    if cpu < task.cpu or mem < task.mem:
        return False
    if whole is None or sliced is None or free is None:
        return True
    return _gpu_room(node, task, whole, sliced, free)


def _fits(node: NodeState, task: TaskState, units: Sequence[_Unit]) -> bool:
    """Would ``task`` fit on ``node`` with ``units`` gone? The CPU, memory and GPU checks of
    ``scoring.fit_on_node``, on paper (a necessary condition; the real check follows)."""
    cpu = node.free_cpu
    mem = node.free_mem
    for u in units:
        cpu += u.cpu
        mem += u.mem
    if cpu < task.cpu or mem < task.mem:
        return False
    gpu = task.gpu
    if not gpu.whole and not gpu.is_slice:
        return True
    whole = list(node.gpu_whole)
    sliced = list(node.gpu_slices)
    free = list(node.gpu_free)
    for u in units:
        for p, n in u.whole.items():
            whole[p] -= n
        for p, (n, mib) in u.slices.items():
            sliced[p] -= n
            free[p] += mib
    return _gpu_room(node, task, whole, sliced, free)


def _gpu_room(node: NodeState, task: TaskState, whole: list[int], sliced: list[int], free: list[int]) -> bool:
    """Whether ``task``'s GPUs fit ``node`` with these holders and free MiB per position."""
    gpu = task.gpu
    ok = node.gpu_ok
    if gpu.is_slice:
        usable = 0
        for p in range(len(ok)):
            if ok[p] and not whole[p] and free[p] >= gpu.slice_on(node.gpu_mem[p]):
                usable += 1
        return usable >= gpu.devices
    allowed = _allowed_positions(node, task)
    empty = 0
    for p in range(len(ok)):
        if ok[p] and not whole[p] and not sliced[p] and (allowed is None or p in allowed):
            empty += 1
    return empty >= gpu.whole


def _allowed_positions(node: NodeState, task: TaskState) -> frozenset[int] | None:
    """The positions of ``node`` a whole-GPU ``task`` may take; None: any.

    Counting GPUs the pod may not take (devices its DRA claims do not
    select, MIG devices for a pod without claims) would pass sets of
    victims that free too little: the search stops at the first set that
    fits on paper, so the set that truly frees enough would never be tried.
    """
    devices = task.spec.devices
    if devices is not None and node.name not in devices.plain:
        chosen = devices.nodes.get(node.name, frozenset())
        return frozenset(p for p, index in enumerate(node.gpu_index) if index in chosen)
    if node.mig:
        return frozenset(p for p, g in enumerate(node.spec.gpus) if g.parent is None)
    return None


def _bounds(
    node: NodeState, task: TaskState, *, lowest: int, reach: list[int], most: int, sliced: bool
) -> tuple[Cost, Cost]:
    """Two lower bounds on the cost of any plan on ``node``: ``(bound, floor)`` of :class:`_NodeView`.

    From the useful victims there: ``lowest`` their lowest priority,
    ``reach`` per victim the GPUs it holds there, ``most`` the most one
    holds whole, ``sliced`` whether any holds a slice. Both bounds say the
    cheapest victim's priority and the whole GPUs still missing (each freed
    GPU had a whole holder among the victims, who give up at least that
    much; a slice holder gives up less, so then only the priority counts).
    For how many pods go, ``bound`` divides the missing GPUs by the most one
    victim frees; ``floor`` counts the fewest victims (one unit per job,
    each at least one pod) whose GPUs there add up to the missing ones, so
    where victims hold one or two GPUs each it is the cost the greedy plan
    reaches, and the search stops at the first node.
    """
    missing = max(0, task.gpu.whole - node.free_whole)
    if missing == 0:
        return (lowest, 0, 1), (lowest, 0, 1)
    # A GPU comes free only where some victim holds it.
    fewest = 0
    covered = 0
    for held in sorted(reach, reverse=True):
        if covered >= missing:
            break
        covered += held
        fewest += 1
    fewest = max(fewest, 1)
    if sliced:
        return (lowest, 0, 1), (lowest, 0, fewest)
    return (lowest, missing * 1000, -(-missing // max(most, 1))), (lowest, missing * 1000, fewest)


def _cost(units: Sequence[_Unit]) -> Cost:
    return (max(u.priority for u in units), sum(u.gpu for u in units), sum(u.pods for u in units))


def _greedy(node: NodeState, task: TaskState, units: list[_Unit]) -> list[_Unit] | None:
    """Units in victim order (a job's shrink before the job) until ``task`` fits, on paper,
    then those a later one made unnecessary spared (a 1-GPU pod, then a 3-GPU pod, for a
    3-GPU task: the 1-GPU pod stays)."""
    chosen: list[_Unit] = []
    for unit in units:
        chosen = [u for u in chosen if u.job is not unit.job]
        chosen.append(unit)
        if _fits(node, task, chosen):
            break
    else:
        return None
    for spare in chosen[:-1]:
        trial = [u for u in chosen if u is not spare]
        if _fits(node, task, trial):
            chosen = trial
    return chosen


def _cheaper_sets(node: NodeState, task: TaskState, units: list[_Unit], below: Cost | None) -> list[list[_Unit]]:
    """Minimal sets of at most ``MAX_VICTIMS_PER_NODE`` units that fit on paper and cost less than ``below``."""
    pool = sorted(units, key=lambda u: (u.priority, u.gpu, u.order, u.shrink is False))[:MAX_UNITS_PER_NODE]
    found: list[tuple[Cost, tuple[int, ...], list[_Unit]]] = []

    def walk(start: int, chosen: list[_Unit], cost: Cost) -> None:
        for i in range(start, len(pool)):
            unit = pool[i]
            if any(u.job is unit.job for u in chosen):
                continue
            step: Cost = (max(cost[0], unit.priority), cost[1] + unit.gpu, cost[2] + unit.pods)
            if below is not None and step >= below:
                continue
            trial = [*chosen, unit]
            if _fits(node, task, trial):
                found.append((step, tuple(u.order for u in trial), trial))
            elif len(trial) < MAX_VICTIMS_PER_NODE:
                walk(i + 1, trial, step)

    walk(0, [], (-(2**62), 0, 0))
    found.sort(key=lambda f: (f[0], f[1]))
    return [f[2] for f in found]


# --------------------------------------------------------------------------
# Trying a set for real
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _Search:
    """What one pod's search needs to try a set of units against the real state."""

    cluster: Cluster
    caches: SessionCaches
    stmt: Statement
    task: TaskState
    admissible: Admissible
    action: EvictionAction
    reason: str
    step: Step | None
    screen: Screen | None = None

    def attempt(self, node: NodeState, units: Sequence[_Unit]) -> bool:
        """Evict ``units`` (smallest first, each admissible when it goes), place the pod, run the step.

        On failure the state is as it was.
        """
        if self.screen is not None:
            going = {id(t): t for unit in units for t in unit.tasks if evictable(t)}
            if not self.screen(node, self.task, list(going.values())):
                return False
        stmt = self.stmt
        mark = stmt.mark()
        beneficiary = self.task.job.key
        for unit in sorted(units, key=lambda u: (u.gpu, u.order)):
            tasks = [t for t in unit.tasks if evictable(t)]
            if unit.shrink and len(tasks) > surplus(unit.job):
                stmt.rollback(mark)
                return False
            if not self.admissible(unit.job, tasks):
                stmt.rollback(mark)
                return False
            for t in tasks:
                stmt.evict(t, self.action, self.reason, beneficiary)
        # Resources and the rules that read the pods around (a victim may
        # have been what a required affinity matched, or what an
        # anti-affinity kept out), judged after the evictions.
        found = fits(self.cluster, self.caches, node, self.task)
        if found is None:
            stmt.rollback(mark)
            return False
        stmt.allocate(self.task, node, *found)
        if self.step is not None and not self.step(stmt, mark):
            stmt.rollback(mark)
            return False
        return True


def _search_node(search: _Search, view: _NodeView, below: Cost | None) -> Cost | None:
    """Place the pod on ``view``'s node by its cheapest plan found costing less than ``below``;
    its cost, with the plan applied, or None with the state untouched."""
    node, task = view.node, search.task
    # Admissibility only gets harder as more is evicted (a rule every action's
    # ``admissible`` keeps), so a unit refused on its own is refused in any set.
    units = [u for u in view.units if search.admissible(u.job, u.tasks)]
    if not units:
        return None
    greedy = _greedy(node, task, units)
    kept: Cost | None = None
    if greedy is not None:
        cost = _cost(greedy)
        if below is None or cost < below:
            mark = search.stmt.mark()
            if search.attempt(node, greedy):
                if cost <= view.floor:
                    return cost
                kept = cost
                search.stmt.rollback(mark)
    limit = kept if kept is not None else below
    for tried, chosen in enumerate(_cheaper_sets(node, task, units, limit)):
        if tried >= MAX_TRIALS_PER_NODE:
            break
        if search.attempt(node, chosen):
            return _cost(chosen)
    if kept is not None and greedy is not None and search.attempt(node, greedy):
        return kept
    return None


def _views(
    task: TaskState, victims: Iterable[JobState], is_candidate: Predicate, elig: list[bool], hopeless: set[int]
) -> list[_NodeView]:
    """Nodes where evicting candidates could make room for ``task`` (see the module docstring, step 1).

    ``hopeless`` lists nodes already found to have too little even with
    every candidate gone, for a pod of this size; it grows with the nodes
    found so here. Within one gang's plan such a node stays hopeless: the
    plan's evictions free what the candidates held (free plus candidates
    stays the same) and its placements only take room, so the gang's later
    pods of the same size skip it without a second look.
    """
    pool = task.job.pool
    seen: set[int] = set()
    options: list[_NodeView] = []
    for victim in victims:
        if not is_candidate(victim):
            continue
        for t in victim.tasks:
            node = t.node
            if node is None or node.pool is not pool or not evictable(t) or id(node) in seen:
                continue
            seen.add(id(node))
            if not elig[node.pidx] or id(node) in hopeless:
                continue
            view = _survey(node, task, is_candidate)
            if view is None:
                hopeless.add(id(node))
            else:
                options.append(view)
                if len(options) >= MAX_NODES_TRIED:
                    return options
        if len(seen) >= MAX_NODES_SCANNED:
            break
    return options


def _place_by_evicting(search: _Search, views: list[_NodeView]) -> bool:
    """The cheapest plan over ``views`` (see the module docstring), applied; False if none.

    Among plans of equal cost, one that keeps a whole-GPU pod off a trap
    node (a GPU out of service the device plugin still offers,
    :func:`scheduler.engine.scoring.trap_rank`) wins over one on a trap
    node: the kubelet's device manager may hand the pod the bad GPU
    whatever gpuwarden assigned. Between two trap nodes the search order
    decides, as between any two nodes.
    """
    views = sorted(views, key=lambda v: v.bound)  # stable: discovery order among equals
    # The lowest floor from each node on: once the best plan costs no more,
    # no node left has a cheaper one (and the search only replaces a plan
    # by a strictly cheaper one, or an equal one off a trap).
    floors: list[Cost] = [v.floor for v in views]
    for i in range(len(floors) - 2, -1, -1):
        floors[i] = min(floors[i], floors[i + 1])
    task = search.task
    whole = 0 if task.gpu.is_slice else task.gpu.whole
    # The best plan so far: its cost, whether it puts the pod on a trap node, where.
    best: tuple[Cost, bool, _NodeView] | None = None
    applied = False
    stmt = search.stmt
    mark = stmt.mark()
    for i, view in enumerate(views):
        trapped = trap_rank(view.node.trap, whole, 0) > 0
        below: Cost | None = None
        if best is not None:
            cost, on_trap = best[0], best[1]
            if cost < floors[i] or (cost == floors[i] and not on_trap):
                break  # no plan on this node or any later one can cost less, nor as little off a trap
            off_trap = on_trap and not trapped
            if cost < view.floor or (cost == view.floor and not off_trap):
                continue  # nothing here costs less, and an equal plan would not be better
            # An equal cost wins on a node that is no trap (costs are integers).
            below = (cost[0], cost[1], cost[2] + 1) if off_trap else cost
        if applied:
            stmt.rollback(mark)
            applied = False
        found = _search_node(search, view, below)
        if found is not None:
            best = (found, trapped, view)
            applied = True
    if best is not None and not applied:
        applied = _search_node(search, best[2], None) is not None
    return applied


def _evict_under_limit(
    stmt: Statement,
    job: JobState,
    request: list[int],
    *,
    victims: Iterable[JobState],
    is_candidate: Predicate,
    admissible: Admissible,
    action: EvictionAction,
    reason: str,
) -> bool:
    """Evict candidates, cheapest first, until ``request`` fits the queue's limits.

    Gives up without evicting anything when even all candidates together
    would not free enough.
    """
    queue = job.queue
    assert queue is not None
    usable: list[JobState] = []
    freed = [0, 0, 0]
    for victim in victims:
        if not is_candidate(victim):
            continue
        tasks = [t for t in victim.tasks if evictable(t)]
        if not tasks or not admissible(victim, tasks):
            continue
        held = held_by(tasks)
        if held != [0, 0, 0]:
            usable.append(victim)
            freed = [freed[r] + held[r] for r in RESOURCES]
    if limit_problem(queue, [request[r] - freed[r] for r in RESOURCES], job.preemptible) is not None:
        return False
    for victim in usable:
        evict_job(stmt, victim, action, reason, job.key)
        if limit_problem(queue, request, job.preemptible) is None:
            return True
    return False


def make_room(
    cluster: Cluster,
    caches: SessionCaches,
    stmt: Statement,
    job: JobState,
    *,
    victims: Callable[[], Iterable[JobState]],
    is_candidate: Predicate,
    admissible: Admissible,
    action: EvictionAction,
    reason: str,
    within_limits: bool = False,
    step: Step | None = None,
    screen: Screen | None = None,
) -> bool:
    """Place ``job``'s gang by evicting candidate victims; all or nothing.

    With ``within_limits`` (preemption: victims from the job's own queue)
    victims are also evicted to bring the queue back under its limit, so
    high-priority work is not stuck behind low-priority work of its own
    queue.

    ``victims()`` yields candidate jobs cheapest first (it may yield others,
    which ``is_candidate`` filters out; non-preemptible jobs are always
    filtered out); ``admissible`` is asked just before each eviction,
    against the state as it then is, ``screen`` before each set of
    evictions is tried and ``step`` after each pod is placed by evicting
    (see the module docstring). On success the evictions and
    placements stay in ``stmt`` (not committed); on failure ``stmt`` is
    rolled back to where it was.
    """
    pool = job.pool
    queue = job.queue
    if pool is None or queue is None or job.error is not None:
        return False
    # Non-preemptible work is never a victim of consolidate, reclaim or
    # preempt, whatever the action's own filter says: the victim index only
    # lists preemptible jobs, but a node found through one is cleared by
    # looking at every job on it, so the rule is enforced here, once.
    action_candidate = is_candidate

    def candidate(victim: JobState) -> bool:
        return victim.preemptible and action_candidate(victim)

    pending = job.pending_tasks()
    required = job.gang_short
    gang = pending[: max(required, 1)]
    if not gang or len(pending) < required:
        return False
    mark = stmt.mark()
    release_for(stmt, job)
    hopeless: dict[tuple[int, int, GpuRequest], set[int]] = {}  # per pod size, see _views
    for task in gang:
        request = [task.milli, task.cpu, task.mem]
        problem = limit_problem(queue, request, job.preemptible)
        if problem is not None and not (
            within_limits
            and problem.code is UnschedulableReason.OVER_LIMIT
            and _evict_under_limit(
                stmt,
                job,
                request,
                victims=victims(),
                is_candidate=candidate,
                admissible=admissible,
                action=action,
                reason=reason,
            )
        ):
            stmt.rollback(mark)
            return False
        found = place_for(cluster, caches, task, reserved_place(task))
        if found is not None:
            stmt.allocate(task, *found)
            continue
        views = _views(
            task,
            victims(),
            candidate,
            eligibility(caches.pool(pool), pool, task).ok,
            hopeless.setdefault((task.cpu, task.mem, task.gpu), set()),
        )
        search = _Search(cluster, caches, stmt, task, admissible, action, reason, step, screen)
        if not views or not _place_by_evicting(search, views):
            stmt.rollback(mark)
            return False
    return True
