"""The victim search: making room for one pending job by evicting others.

Used by consolidate, reclaim and preempt through the shared loop in
:mod:`scheduler.engine.eviction_plan`; they differ only in who may be a
victim.

The plan is built node by node, the way a person would clear space: for
each task of the beneficiary's gang that does not fit anywhere as things
stand, find nodes it could use (static predicates pass) where evicting
candidate victims would free enough, evict them there in the action's victim
order until the task fits, and place it. A victim job is evicted whole (its
tasks on other nodes too): half a gang is worth nothing to anyone. If any
task cannot be placed the whole plan is rolled back.

Nodes are discovered through the victims, cheapest victim first, so the
search looks where the cheapest room is and never walks nodes that host no
candidate. Cost is bounded: per task at most ``MAX_NODES_SCANNED`` nodes are
examined and ``MAX_NODES_TRIED`` of them tried (the shared loop bounds how
many jobs an action plans for).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuwarden.contract import EvictionAction, UnschedulableReason
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.limits import limit_problem
from scheduler.engine.predicates import eligibility
from scheduler.engine.reservations import release_for, reserved_place
from scheduler.engine.resources import CPU, GPU, MEMORY, RESOURCES
from scheduler.engine.scoring import find_place, fits
from scheduler.engine.state import Cluster, JobState, NodeState, TaskState
from scheduler.engine.statement import Statement

MAX_NODES_TRIED = 8
MAX_NODES_SCANNED = 256

Predicate = Callable[[JobState], bool]


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


def _potential_ok(node: NodeState, task: TaskState, is_candidate: Predicate) -> bool:
    """Could evicting candidates on ``node`` make room for ``task``?"""
    cpu = node.free_cpu
    mem = node.free_mem
    victim_positions: dict[int, int] = {}
    for t in node.tasks:
        if evictable(t) and is_candidate(t.job):
            cpu += t.cpu
            mem += t.mem
            for p in t.gpu_pos:
                victim_positions[p] = victim_positions.get(p, 0) + 1
    if (task.cpu > 0 and cpu < task.cpu) or (task.mem > 0 and mem < task.mem):
        return False
    gpu = task.gpu
    if gpu.is_slice:
        return node.free_whole + len(victim_positions) >= gpu.devices
    # A GPU comes free only if every holder on it is a candidate.
    freeable = 0
    for p, count in victim_positions.items():
        if node.gpu_ok[p] and node.gpu_whole[p] + node.gpu_slices[p] == count:
            freeable += 1
    return node.free_whole + freeable >= gpu.whole


def _clear_node(
    stmt: Statement,
    caches: SessionCaches,
    *,
    node: NodeState,
    task: TaskState,
    is_candidate: Predicate,
    rank: Callable[[JobState], tuple[int, float, str]],
    admissible: Predicate,
    action: EvictionAction,
    reason: str,
) -> bool:
    """Evict candidates on ``node``, cheapest first, until ``task`` fits; place it.

    "Fits" is room and every placement rule (:func:`scheduler.engine.scoring.fits`):
    room freed beside a pod the task's anti-affinity keeps it from, or on a
    host port another pod holds, is no room for it.

    Evicting in order can take a victim that a later, larger one makes
    unnecessary (a 1-GPU pod, then a 3-GPU pod, for a 3-GPU task); such
    victims are spared before anything is kept, so no pod is evicted for
    room nobody uses.
    """
    cluster = stmt.cluster
    on_node: dict[int, JobState] = {}
    for t in node.tasks:
        if evictable(t) and id(t.job) not in on_node and is_candidate(t.job):
            on_node[id(t.job)] = t.job
    mark = stmt.mark()
    chosen: list[JobState] = []
    for victim in sorted(on_node.values(), key=rank):
        if not admissible(victim):
            continue
        evict_job(stmt, victim, action, reason, task.job.key)
        chosen.append(victim)
        if fits(cluster, caches, node, task) is not None:
            break
    else:
        return False
    if len(chosen) > 1:
        stmt.rollback(mark)
        needed = chosen
        for spare in chosen[:-1]:
            trial = [v for v in needed if v is not spare]
            trial_mark = stmt.mark()
            for victim in trial:
                evict_job(stmt, victim, action, reason, task.job.key)
            enough = fits(cluster, caches, node, task) is not None
            stmt.rollback(trial_mark)
            if enough:
                needed = trial
        for victim in needed:
            evict_job(stmt, victim, action, reason, task.job.key)
    found = fits(cluster, caches, node, task)
    assert found is not None
    stmt.allocate(task, node, *found)
    return True


def _nodes_to_try(
    task: TaskState, victims: Iterable[JobState], is_candidate: Predicate, elig: list[bool]
) -> list[NodeState]:
    pool = task.job.pool
    seen: set[int] = set()
    options: list[NodeState] = []
    for victim in victims:
        if not is_candidate(victim):
            continue
        for t in victim.tasks:
            node = t.node
            if node is None or node.pool is not pool or not evictable(t) or id(node) in seen:
                continue
            seen.add(id(node))
            if elig[node.pidx] and _potential_ok(node, task, is_candidate):
                options.append(node)
                if len(options) >= MAX_NODES_TRIED:
                    return options
        if len(seen) >= MAX_NODES_SCANNED:
            break
    return options


def _evict_under_limit(
    stmt: Statement,
    job: JobState,
    request: list[int],
    *,
    victims: Iterable[JobState],
    is_candidate: Predicate,
    admissible: Predicate,
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
        if not is_candidate(victim) or not admissible(victim):
            continue
        held = [0, 0, 0]
        for t in victim.tasks:
            if evictable(t):
                held[GPU] += t.milli
                held[CPU] += t.cpu
                held[MEMORY] += t.mem
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
    admissible: Predicate,
    action: EvictionAction,
    reason: str,
    within_limits: bool = False,
) -> bool:
    """Place ``job``'s gang by evicting candidate victims; all or nothing.

    With ``within_limits`` (preemption: victims from the job's own queue)
    victims are also evicted to bring the queue back under its limit, so
    high-priority work is not stuck behind low-priority work of its own
    queue.

    ``victims()`` yields candidate jobs cheapest first (it may yield others,
    which ``is_candidate`` filters out; non-preemptible jobs are always
    filtered out); ``admissible`` is asked just before
    each eviction, against the state as it then is. On success the
    evictions and placements stay in ``stmt`` (not committed); on failure
    ``stmt`` is rolled back to where it was.
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
        found = reserved_place(task) or find_place(cluster, caches, task)
        if found is not None:
            stmt.allocate(task, *found)
            continue
        placed = False
        for node in _nodes_to_try(task, victims(), candidate, eligibility(caches.pool(pool), pool, task).ok):
            node_mark = stmt.mark()
            if _clear_node(
                stmt,
                caches,
                node=node,
                task=task,
                is_candidate=candidate,
                rank=victim_order,
                admissible=admissible,
                action=action,
                reason=reason,
            ):
                placed = True
                break
            stmt.rollback(node_mark)
        if not placed:
            stmt.rollback(mark)
            return False
    return True
